"""The engine's operators: parsing and dead-letter verdicts, pre-aggregation, window and
session state, stateful functions, and the Arrow blobs they pack their rows into.
Internal: jobs reach them through the declarations of ``kappaflow.streams``."""
