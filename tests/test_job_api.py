"""The job API's declarations: what a wrong job gets told, under the harness and on the
command line, and a plain stream's records written exactly as declared."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jobs_under_test
import pytest
from conftest import REPO, RunCli, error_line
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import kappaflow as kf
from kappaflow.errors import KappaflowError

EXAMPLES = REPO / "examples"
SUPPORT = REPO / "tests" / "support"


@pytest.mark.parametrize(
    ("build", "code", "message"),
    [
        (jobs_under_test.raises, "KF733", "raises(job) failed: RuntimeError: the reference"),
        (jobs_under_test.declares_nothing, "KF731", "declares no output"),
        (jobs_under_test.unknown_column, "KF732", "no column 'region'"),
        (jobs_under_test.redis_for_records, "KF730", "windowed results"),
        (jobs_under_test.schema_does_not_compile, "KF701", "payload"),
    ],
)
def test_a_wrong_job_is_told_what_is_wrong(
    spark: SparkSession, build: Callable[[kf.Job], None], code: str, message: str
) -> None:
    with pytest.raises(KappaflowError) as raised:
        kf.testing.run(build, {"orders": [[]]}, spark=spark)
    assert raised.value.code == code
    assert message in str(raised.value)


def test_a_source_the_test_gave_nothing(spark: SparkSession) -> None:
    from revenue import build

    with pytest.raises(KappaflowError) as raised:
        kf.testing.run(build, {"payments": [[]]}, spark=spark)
    assert raised.value.code == "KF734"
    assert "'orders'" in str(raised.value)


@dataclass
class Click:
    user: str
    page: str
    at: kf.EventTime
    ms: int | None = None


def slow_pages(job: kf.Job) -> None:
    clicks = job.source("clicks", Click, key="user")
    clicks.where(F.col("ms") > 1000).select("user", "page", "ms").to(
        kf.topic("slow"), kf.lake("slow")
    )


def test_a_stream_to_kafka_and_the_lake(spark: SparkSession) -> None:
    batches: list[list[Any]] = [
        [
            {"user": "ada", "page": "/a", "at": 1_700_000_000_000, "ms": 1500},
            {"user": "bob", "page": "/b", "at": 1_700_000_001_000, "ms": 20},
            {"user": "bob", "page": "/c", "at": "2023-11-14T22:13:22Z"},
        ],
        [b'{"user": "cy", "page": 3, "at": 1700000002000}'],
        [{"user": "cy", "page": "/d", "at": "1700000003000", "ms": 4000}],
    ]
    out = kf.testing.run(slow_pages, {"clicks": batches}, spark=spark, name="pages")
    assert out.records("slow") == [
        {"user": "ada", "page": "/a", "ms": 1500},
        {"user": "cy", "page": "/d", "ms": 4000},
    ]
    assert out.keys("slow") == [["ada"], ["cy"]]
    assert sorted((r["user"], r["ms"]) for r in out.lake("slow")) == [("ada", 1500), ("cy", 4000)]
    [dead] = out.dead_letters
    assert "'page'" in dead["error"] and dead["source_offset"] == 3
    assert json.loads(dead["value"])["page"] == 3


def refuses_slow_clicks(job: kf.Job) -> None:
    clicks = job.source("clicks", Click, key="user")
    too_slow = F.concat(F.lit("ms "), F.col("ms").cast("string"), F.lit(" is over a minute"))
    kept = clicks.reject(F.col("ms") > 60_000, too_slow)
    kept.select("user", "page", "ms").to(kf.topic("kept"))
    # A second output of the refusing stream: its refusals are not sent again.
    kept.where(F.col("page") == "/a").to(kf.topic("a-pages"))


def test_records_a_rule_refuses_go_to_the_dead_letters_once(spark: SparkSession) -> None:
    batches: list[list[Any]] = [
        [
            {"user": "ada", "page": "/a", "at": 1_700_000_000_000, "ms": 1500},
            {"user": "bob", "page": "/b", "at": 1_700_000_001_000, "ms": 90_000},
        ],
        [b'{"user": "cy", "page": 3, "at": 1700000002000}'],
        [
            {"user": "cy", "page": "/a", "at": 1_700_000_003_000, "ms": 61_000},
            {"user": "dan", "page": "/a", "at": 1_700_000_004_000},
        ],
    ]
    out = kf.testing.run(refuses_slow_clicks, {"clicks": batches}, spark=spark, name="clicks")
    assert out.records("kept") == [
        {"user": "ada", "page": "/a", "ms": 1500},
        {"user": "dan", "page": "/a"},
    ]
    assert [r["user"] for r in out.records("a-pages")] == ["ada", "dan"]
    dead = sorted(out.dead_letters, key=lambda d: d["source_offset"])
    assert [(d["source_offset"], d["error"]) for d in dead if "over a minute" in d["error"]] == [
        (1, "ms 90000 is over a minute"),
        (3, "ms 61000 is over a minute"),
    ]
    assert [d["source_offset"] for d in dead] == [1, 2, 3]
    assert json.loads(dead[0]["value"]) == batches[0][1]
    assert out.stats("kept")["dead_letters"] == 3


def test_cli_misuse_of_app_jobs(cli: RunCli) -> None:
    env = {"PYTHONPATH": f"{SUPPORT}:{EXAMPLES}"}
    missing = cli("jobs", "start", "x", "--app", "no_such_module:build", env=env)
    assert "no module named 'no_such_module'" in error_line(missing, "KF603", 1)
    both = cli("jobs", "start", "x", "--app", "revenue:build", "--pipeline", "count", env=env)
    assert "exactly one of --app and --pipeline" in error_line(both, "KF508", 1)
    not_a_function = cli("jobs", "check", "--app", "revenue:Order", env=env)
    assert "not a function build(job)" in error_line(not_a_function, "KF604", 1)
