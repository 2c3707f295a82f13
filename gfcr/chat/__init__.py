"""A policy's chat template in token space: conversations rendered once and then extended
by ids (``formats``: the :class:`gfcr.core.trajectory.ChatFormat` a trajectory renders
through), with the template's special tokens kept apart from the messages' text so that
content cannot forge turns (``specials``). It sits above ``gfcr.core`` (the engine's
tokenizer, the environment's messages) and below the stages that hold conversations.
"""
