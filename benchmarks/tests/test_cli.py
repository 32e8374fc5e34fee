"""The kappaflow-bench command line, and the product without it."""

from __future__ import annotations

import pytest

from kappaflow.cli import main as kappaflow_main
from kappaflow_bench.cli import main

COMMANDS = (
    "count",
    "count-scale",
    "api",
    "iot-ingest",
    "iot-latency",
    "scale-out",
    "ysb",
    "ysb-sweep",
    "ysb-generator",
)


def test_kappaflow_bench_has_the_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {command} " in listed for command in COMMANDS), listed


def test_the_product_has_no_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    assert kappaflow_main(["bench", "--help"]) == 2
    assert "No such command 'bench'" in capsys.readouterr().err
    assert kappaflow_main(["demo", "--help"]) == 0


def test_misuse_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["count", "--measure", "ceiling,warp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kappaflow-bench: error[KF001]: "), err
    assert "warp" in err[0] and "--measure" in err[0]


def test_api_misuse_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["api", "--repeat", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kappaflow-bench: error[KF001]: "), err
    assert "'--repeat': 0 is not in the range" in err[0], err


def test_scale_out_misuse_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scale-out", "--workers", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kappaflow-bench: error[KF001]: "), err
    assert "--workers" in err[0] and "two worker counts" in err[0], err
    assert main(["scale-out", "--workers", "1,x"]) == 2
    assert "not a list of numbers: '1,x'" in capsys.readouterr().err
