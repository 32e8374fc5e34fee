"""A window query's checkpoint keeps the operator (Python's or the engine's Java one) it
was started with: a restart under another default resumes it on the same operator, and
only a new checkpoint takes the session's (streams/window_engine.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from window_runs import run_job

import kappaflow as kf
from kappaflow.streams.window_engine import RECORD, checkpoint_engine

MINUTE = 60_000
#: Spark's names of the two operators, in a query's progress.
OPERATORS = {"python": "transformWithStateInPandasExec", "jvm": "transformWithStateExec"}


@dataclass
class View:
    page: str
    at: kf.EventTime


def build(job: kf.Job) -> None:
    views = job.source("views", View, watermark="0s")
    views.window(tumbling="1m").aggregate("per_page", by="page", n=kf.count()).to(kf.store())


def view(page: str, at_ms: int) -> dict[str, Any]:
    return {"page": page, "at": at_ms}


def run(
    spark: SparkSession, home: Path, batches: Sequence[Sequence[Any]], engine: str
) -> tuple[dict[tuple[str, int], int], set[str]]:
    """Run the job over ``batches`` (those a run before read are read again only by
    name: skipped) on checkpoint ``home/checkpoints``, the session's operator ``engine``:
    the windows it wrote (page, start → count) and the operators its query ran."""
    store, operators = run_job(spark, home, build, "pages", "views", batches, engine)
    windows = store.windows.get("per_page", {})
    counts = {(json.loads(key)[0], start): w["values"]["n"] for (key, start), w in windows.items()}
    return counts, operators


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "made-before-the-record"])
def test_a_checkpoint_keeps_the_operator_it_was_started_with(
    spark: SparkSession, tmp_path: Path, recorded: bool
) -> None:
    first = [[view("/a", 1_000), view("/b", 2_000)], [view("/a", 3_000)]]
    later = [[view("/a", 4_000), view("/c", MINUTE + 1_000)]]
    checkpoint = tmp_path / "old" / "checkpoints" / "per_page"

    counts, operators = run(spark, tmp_path / "old", first, "python")
    assert operators == {OPERATORS["python"]}
    assert counts == {("/a", 0): 2, ("/b", 0): 1}
    assert json.loads((checkpoint / RECORD).read_text()) == {"windows": "python"}
    if not recorded:
        # A checkpoint from before the record: its state metadata names the operator.
        (checkpoint / RECORD).unlink()
        assert checkpoint_engine(spark, str(checkpoint)) == "python"

    # Restarted where the session says jvm: the checkpoint's operator resumes it, its
    # state intact: /a's window counts on from 2, and /b's, which the run did not see,
    # is made final as the watermark passes it (/c at 1:01).
    counts, operators = run(spark, tmp_path / "old", first + later, "jvm")
    assert operators == {OPERATORS["python"]}
    assert counts == {("/a", 0): 3, ("/b", 0): 1, ("/c", MINUTE): 1}
    assert json.loads((checkpoint / RECORD).read_text()) == {"windows": "python"}

    # A new checkpoint takes the session's operator.
    counts, operators = run(spark, tmp_path / "new", first + later, "jvm")
    assert operators == {OPERATORS["jvm"]}
    assert counts == {("/a", 0): 3, ("/b", 0): 1, ("/c", MINUTE): 1}
    assert checkpoint_engine(spark, str(tmp_path / "new" / "checkpoints" / "per_page")) == "jvm"
    # And keeps it when the session says python.
    again = [[view("/c", MINUTE + 2_000)]]
    counts, operators = run(spark, tmp_path / "new", first + later + again, "python")
    assert operators == {OPERATORS["jvm"]}
    assert counts == {("/c", MINUTE): 2}
