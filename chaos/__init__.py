"""The chaos driver: churn and faults against a running local stack, with invariants checked
all along (``python -m chaos --help``)."""
