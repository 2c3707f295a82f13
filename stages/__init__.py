"""The operator library: importing it registers every stage and component with gfcr.

One folder per kind (generate, filter, control, replay, train) plus the engines and the
tasks. gfcr finds this package through the ``gfcr.plugins`` entry point.
"""
