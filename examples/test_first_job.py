"""The first job's test: docs/jobs.md, "Test it"."""

from pyspark.sql import SparkSession

import kappaflow as kf
from first_job import build


def test_views_per_page_and_minute(spark: SparkSession) -> None:
    batches = [
        [
            {"user": "ada", "page": "/", "at": "2026-11-23T10:00:01Z"},
            {"user": "bob", "page": "/", "at": "2026-11-23T10:00:30Z"},
            {"user": "ada", "page": "/", "at": "2026-11-23T10:00:42Z"},
            "not even JSON",
        ],
        # 10:01:10 moves the watermark (5 s behind it) past 10:01: in the next batch
        # the minute from 10:00 becomes final.
        [{"user": "cy", "page": "/docs", "at": "2026-11-23T10:01:10Z"}],
        [],
    ]
    out = kf.testing.run(build, {"clicks": batches}, spark=spark)

    home = [c for c in out.changes("views") if c["page"] == "/"]
    assert [c["kind"] for c in home] == ["provisional", "final"]
    assert home[-1]["values"] == {"views": 3, "users": 2}
    assert out.dead_letters[0]["error"] == "not valid JSON"
