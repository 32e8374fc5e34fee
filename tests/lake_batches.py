"""The batches the lake's tests write (test_lake.py, the manifest lake; test_lake_delta.py,
Delta tables), and the crash they inject at a step of ``write``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame, SparkSession

SCHEMA = "id INT, region STRING, ts TIMESTAMP, amount DOUBLE"
START = datetime(2026, 11, 23, 22, 0, tzinfo=UTC)


class CrashError(Exception):
    """The driver dying at a step of ``write``."""


def batch(spark: SparkSession, first: int, count: int = 4) -> DataFrame:
    """Rows ``first`` … ``first + count - 1``, an hour apart from 22:00 UTC (so a batch
    crosses midnight), in two regions."""
    rows = [
        (i, "eu" if i % 2 else "us", START + timedelta(hours=i), i * 1.5)
        for i in range(first, first + count)
    ]
    return spark.createDataFrame(rows, SCHEMA)
