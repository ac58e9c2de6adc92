"""The picture of a run from an ``elastic-run --events`` file (``elastic-plot``).

Placeholder: the plot tool still lives in ``driver/plot.py``; this package only gives the
``elastic-plot`` console script something to resolve. The driver restructuring replaces
this package with the real one (the tool moves out of the driver package).
"""
