"""What a user writes, read and checked: pipeline YAML through a bounded loader
(``yamlfile``), ``--set PATH=VALUE`` overrides (``overrides``), every problem of a Python
pipeline file collected at once (``problems``), and code named by import path in a config
(``refs``). It sits below ``gfcr.core``, which builds pipelines with it, and imports nothing
else of gfcr.
"""
