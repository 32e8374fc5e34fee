"""The job API: jobs users write in Python, with kappaflow's guarantees by default.

A job is a function ``build(job)`` that declares typed sources, windowed aggregates,
stateful functions and sinks; kappaflow compiles the declaration into Spark Structured
Streaming queries whose outputs are exactly once. The public names are re-exported from
``kappaflow``.
"""
