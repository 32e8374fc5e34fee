"""The job API and its engine: jobs users write in Python, with kappaflow's guarantees
by default.

A job is a function ``build(job)`` that declares typed sources, windowed aggregates,
stateful functions and sinks (the vocabulary: ``model``, ``schema``, ``aggregates``,
``sinks``, ``stateful``, ``kinds``; the fluent API: ``job``, ``joins``,
``stateful_plan``); ``runtime`` compiles the declaration into Spark Structured Streaming
queries built from the operators in ``ops`` and written by ``output``, exactly once. The
public names are re-exported from ``kappaflow``.
"""
