"""kappaflow's benchmarks, a distribution of their own beside the product.

The counting job's throughput, latency and state at scale (``count``, ``scale``), and
the Yahoo Streaming Benchmark on kappaflow and on peer engines (``ysb``). They use
kappaflow as any user would; nothing in kappaflow depends on them.
"""
