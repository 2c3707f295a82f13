"""Experiment trackers as run hooks: MLflow (``mlflow_hook``, the only module that imports
mlflow) and Weights & Biases and TensorBoard beside it (``trackers``, which builds the ones a
run names with ``gfcr run --tracker``). It imports ``gfcr.core``; nothing in the loop
imports it.
"""
