"""A run's state at a step boundary: written (``checkpoint``: weights, learner and RNG
states, flushed before they are named whole, ``durable``), continued (``resume``: whether a
pipeline may continue a stored run, and the check on replayed steps), stopped at cleanly
(``cancel``: Ctrl-C, SIGTERM, a cancelled flow run) and exported as a model folder other
tools load (``export``). It imports ``gfcr.core`` and ``gfcr.tracking``.
"""
