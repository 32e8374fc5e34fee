"""The Yahoo Streaming Benchmark on kappaflow: generator, pipeline, check and results.

The workload, the Redis layout and the latency method follow the original benchmark
(yahoo/streaming-benchmarks, December 2015); where kappaflow differs, the module that
differs says how and why.
"""
