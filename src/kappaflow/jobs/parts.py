"""A job's parts (``jobs.contract.Part``): driver processes beside the job's main driver.

The main driver starts each part once its own queries run, waits until the part's
queries run too, watches it while the job runs, and stops it when the job stops. A part
writes its state to ``<job dir>/<part>.json`` and its log to ``<job dir>/<part>.log``;
it watches its parent and stops by itself when the main driver is gone (killed), so a
crashed job leaves no part running.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kappaflow.errors import JobStartError
from kappaflow.jobs.files import write_atomically
from kappaflow.jobs.manager import JobState
from kappaflow.procs import ManagedProcess, ProcState, tail
from kappaflow.waiting import wait_for

if TYPE_CHECKING:
    from kappaflow.jobs.contract import Part

PART_ARG = "--kappaflow-part="


def part_process(home: Path, part: str) -> ManagedProcess:
    return ManagedProcess(
        f"job part {part}",
        home / f"{part}.pid",
        (f"--kappaflow-job={home} {PART_ARG}{part}",),
    )


def write_part_state(home: Path, part: str, state: JobState, error: str | None = None) -> None:
    record = {"state": state, "pid": os.getpid(), "error": error}
    write_atomically(home / f"{part}.json", json.dumps(record) + "\n")


@dataclass(frozen=True)
class PartRecord:
    """What a part's driver recorded: its state (None before it wrote one), pid, error."""

    state: JobState | None = None
    pid: int | None = None
    error: str | None = None


def read_part_state(home: Path, part: str) -> PartRecord:
    """The part's record; an empty one before the part wrote any."""
    try:
        loaded: dict[str, Any] = json.loads((home / f"{part}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return PartRecord()
    state = loaded.get("state")
    return PartRecord(JobState(state) if state else None, loaded.get("pid"), loaded.get("error"))


def part_state(home: Path, part: str) -> JobState:
    """What a part is doing: its recorded state, or ``CRASHED`` when it recorded running
    but its process is gone; ``ABSENT`` when it never started."""
    state = read_part_state(home, part).state
    if state is None:
        return JobState.ABSENT
    if (
        state is JobState.RUNNING
        and part_process(home, part).status().state is not ProcState.RUNNING
    ):
        return JobState.CRASHED
    return state


class PartProcesses:
    """The parts of one job, seen from its main driver."""

    def __init__(self, home: Path, parts: list[Part]) -> None:
        self.home = home
        self.names = [part.name for part in parts]

    def start(self, timeout: float) -> None:
        """Start every part; return once all of their queries run."""
        for name in self.names:
            process = part_process(self.home, name)
            # A part of an earlier run whose driver was killed stops by itself within a
            # poll; one still there must not share the checkpoint with the new one.
            process.stop(timeout=10)
            (self.home / f"{name}.json").unlink(missing_ok=True)
            argv = [
                sys.executable,
                "-m",
                "kappaflow.jobs.runner",
                f"--kappaflow-job={self.home}",
                f"{PART_ARG}{name}",
            ]
            # The main driver's environment, which building its session completed
            # (spark/environment.py): the part runs with the same master's needs.
            process.spawn(argv, log_file=self.home / f"{name}.log", env=dict(os.environ))
        for name in self.names:
            wait_for(
                partial(self._running, name),
                timeout=timeout,
                interval=0.5,
                what=f"job part {name} to start",
            )

    def _running(self, name: str) -> bool | None:
        if read_part_state(self.home, name).state is JobState.RUNNING:
            return True
        failure = self._failure(name)
        if failure is not None:
            raise JobStartError(failure)
        return None

    def failure(self) -> str | None:
        """Why a part ended while the job runs, or None while all of them run."""
        for name in self.names:
            failure = self._failure(name)
            if failure is not None:
                return failure
        return None

    def _failure(self, name: str) -> str | None:
        if part_process(self.home, name).status().state is ProcState.RUNNING:
            return None
        recorded = read_part_state(self.home, name)
        if recorded.error:
            return f"part {name} failed: {recorded.error}"
        last = tail(self.home / f"{name}.log", 1)
        return (
            f"part {name} exited ({recorded.state or 'before it ran'}): "
            f"{last[-1] if last else '?'} (log: {self.home / f'{name}.log'})"
        )

    def stop(self, timeout: float) -> None:
        for name in self.names:
            part_process(self.home, name).stop(timeout=timeout)
