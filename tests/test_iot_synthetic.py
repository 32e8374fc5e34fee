"""The development series: made from a seed, labelled, and read by the evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from conftest import RunCli

from kappaflow.iot.evaluation import corpus, read_series
from kappaflow.iot.nab import probation
from kappaflow.iot.synthetic import make_series, write_corpus


def test_a_seed_makes_the_same_series_and_another_seed_others(tmp_path: Path) -> None:
    one = write_corpus(tmp_path / "a", 4, 3)
    again = write_corpus(tmp_path / "b", 4, 3)
    other = write_corpus(tmp_path / "c", 5, 3)
    assert [p.read_bytes() for p in one] == [p.read_bytes() for p in again]
    assert [p.read_bytes() for p in one] != [p.read_bytes() for p in other]


def test_series_have_varied_scales_shapes_and_labels_after_probation() -> None:
    made = [make_series(seed, f"s{seed}") for seed in range(40)]
    scales = [float(np.median(np.abs(m.values))) for m in made]
    assert min(scales) < 1.0 and max(scales) > 10_000.0
    counts = [int(m.labels.sum()) for m in made]
    assert 0 in counts and max(counts) >= 2
    for m in made:
        onsets = np.flatnonzero(m.labels)
        assert all(row >= probation(len(m.values)) for row in onsets)
    shapes = {word for m in made for word in m.kinds}
    for wanted in ("daily", "weekly", "drift", "shift", "spike", "dip", "stuck", "dropout"):
        assert wanted in shapes
    assert {m.step_min for m in made} >= {1, 5, 60}


def test_evaluate_reads_gzipped_series_and_scores_them_by_the_nab_rules(
    cli: RunCli, tmp_path: Path
) -> None:
    written = write_corpus(tmp_path / "in", 11, 2)
    assert corpus(tmp_path / "in") == written
    lengths = [len(read_series(p).values) for p in written]
    result = cli(
        "iot", "evaluate", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
        "--path", "local",
    )  # fmt: skip
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["rows"] == sum(lengths) and summary["labelled_files"] == 2
    nab = summary["nab"]
    assert set(nab) >= {"standard", "reward_low_FP_rate", "reward_low_FN_rate", "windows"}
    for path, length in zip(written, lengths, strict=True):
        scored = (tmp_path / "out" / path.name.removesuffix(".gz")).read_text().splitlines()
        assert scored[0] == "timestamp,value,anomaly_score" and len(scored) == length + 1
