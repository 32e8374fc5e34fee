"""The product's fixtures, for the benchmarks' tests: one real Kafka broker, Redis and
Spark session per test session, fresh topics per test (see tests/conftest.py)."""

from conftest import kafka, new_topic, serving, settings, spark

__all__ = ["kafka", "new_topic", "serving", "settings", "spark"]
