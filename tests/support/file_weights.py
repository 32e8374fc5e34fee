"""How long each test file took in a real run, per tier, and the order that makes of them.

make test, test-long and test-cluster give whole files to two workers, each the next file
once it is done: a long file left for last runs alone while the other worker idles, so
the longest files go first. Their seconds come from ``tests/file_weights.json``, which
``make test-weights`` writes from real runs of each tier (``--record-weights``): each
tier (its ``-m`` expression) has the seconds of its own tests, file by file. A file the
table does not know yet weighs nothing and runs after those it knows.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

WEIGHTS = Path(__file__).resolve().parents[1] / "file_weights.json"


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-weights",
        action="store_true",
        help=f"write each file's seconds in this run into {WEIGHTS.name}, under this tier",
    )


def tier(config: pytest.Config) -> str:
    """The tier a run is: its ``-m`` expression, as the Makefile gives it."""
    return str(config.getoption("markexpr") or "")


def file_weights(config: pytest.Config) -> dict[str, float]:
    """Each file's seconds in this run's tier, as last recorded."""
    if not WEIGHTS.is_file():
        return {}
    recorded: dict[str, dict[str, float]] = json.loads(WEIGHTS.read_text())
    return recorded.get(tier(config), {})


class Recorder:
    """Sums each file's test seconds (set-up, call and tear-down) as reports arrive; in
    a run on workers the controller sees every worker's reports."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.failed = False

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[Path(report.nodeid.split("::")[0]).name] += report.duration
        self.failed = self.failed or report.failed

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.seconds:
            return  # a worker: the controller records
        if self.failed:
            # A failed run's seconds say how long it took to fail, not to pass.
            print(f"\n{WEIGHTS.name}: not written, the run failed")
            return
        recorded = json.loads(WEIGHTS.read_text()) if WEIGHTS.is_file() else {}
        recorded[tier(session.config)] = {
            name: round(seconds, 1)
            for name, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1])
        }
        WEIGHTS.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
        print(
            f"\n{WEIGHTS.name}: recorded {len(self.seconds)} files for -m {tier(session.config)!r}"
        )


def configure(config: pytest.Config) -> None:
    if config.getoption("record_weights"):
        config.pluginmanager.register(Recorder(), "file-weights-recorder")
