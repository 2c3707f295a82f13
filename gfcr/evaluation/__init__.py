"""Held-out evaluation: greedy (and optionally sampled) decoding of the task's held-out
prompts, scored by the task (``heldout``), and the columns of an evaluated completion as the
store keeps them (``columns``). A generator service runs it; it imports only ``gfcr.core``.
"""
