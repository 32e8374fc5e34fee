"""Streaming jobs as processes of their own, found and managed by name.

A job lives in ``<state_dir>/jobs/<name>/``: ``job.json`` (its definition and state,
written by the CLI and then by the job's driver), ``driver.log`` and ``progress.json``.
Its Spark checkpoint lives in ``<state_dir>/checkpoints/<name>/`` (a job on the job API:
under the ``checkpoint_dir`` setting when that is set), so starting a job of the same name
again resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from kappaflow.errors import (
    InvalidJobNameError,
    JobDirError,
    JobError,
    JobNotFoundError,
    JobNotRunningError,
    JobRunningError,
    JobStartError,
    JobStartTimeoutError,
    RestoreIncompleteError,
)
from kappaflow.jobs.files import PLAN, RESTORING, local_path, write_atomically
from kappaflow.jobs.pipeline import load_pipeline
from kappaflow.procs import ManagedProcess, ProcState, tail
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.spark.environment import spark_environment
from kappaflow.timeutil import iso
from kappaflow.waiting import wait_for

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")
#: How long ``start`` waits for a job to run: its driver's own start (a JVM, the session,
#: the queries; a minute or more on a busy two-core machine) and then its parts'
#: (runner.PART_START_TIMEOUT_S, 150 s).
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0


class JobState(StrEnum):
    """Where a job is in its life. ``CRASHED`` is never recorded but derived: the record
    says the job runs, yet no driver process does; ``ABSENT``: no job of that name."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"
    KILLED = "killed"
    CRASHED = "crashed"
    ABSENT = "absent"


#: States in which a job's driver should be running.
ACTIVE_STATES = (JobState.STARTING, JobState.RUNNING)


@dataclass
class JobRecord:
    name: str
    pipeline: str
    params: dict[str, str]
    overrides: SettingsOverrides = field(default_factory=SettingsOverrides)
    config_file: str | None = None
    state: JobState = JobState.STARTING
    pid: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    error: str | None = None
    #: Whether the job runs in Spark's real-time mode (``jobs start --real-time``).
    real_time: bool = False

    @classmethod
    def load(cls, path: Path) -> JobRecord:
        fields = json.loads(path.read_text())
        return cls(
            **{
                **fields,
                "state": JobState(fields["state"]),
                "overrides": SettingsOverrides.from_json(fields.get("overrides") or {}),
            }
        )

    def save(self, path: Path) -> None:
        fields = {**asdict(self), "overrides": self.overrides.to_json()}
        write_atomically(path, json.dumps(fields, indent=2) + "\n")


def validate_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidJobNameError(
            f"invalid job name {name!r}: use letters, digits, '.', '_' and '-' (max 101)"
        )
    return name


class JobManager:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = settings.jobs_dir.resolve()

    def job_dir(self, name: str) -> Path:
        return self.root / validate_name(name)

    def _process(self, name: str) -> ManagedProcess:
        home = self.job_dir(name)
        return ManagedProcess(f"job {name}", home / "driver.pid", (f"--kappaflow-job={home}",))

    def start(
        self,
        name: str,
        pipeline: str,
        params: dict[str, str],
        *,
        overrides: SettingsOverrides | None = None,
        config_file: Path | None = None,
        wait: bool = True,
        timeout: float = START_TIMEOUT_S,
        real_time: bool = False,
    ) -> JobRecord:
        """Start the job's driver; with ``wait``, return once its queries run.
        ``real_time``: a job on the job API, in Spark's real-time mode."""
        # An unknown pipeline fails here, not in the background.
        if real_time:
            load_pipeline(pipeline, real_time=True)
        else:
            load_pipeline(pipeline)
        home = self.job_dir(name)
        process = self._process(name)
        if process.status().state is ProcState.RUNNING:
            raise JobRunningError(f"job {name!r} is already running (pid {process.status().pid})")
        if (home / RESTORING).exists():
            # Its sinks, store and checkpoint may be half way back to the savepoint.
            restoring = json.loads((home / RESTORING).read_text())
            raise RestoreIncompleteError(
                f"job {name!r} was being restored from savepoint {restoring['savepoint']!r} "
                "and the restore did not finish: start it with --from-savepoint "
                f"{restoring['savepoint']} (or another savepoint)"
            )
        process.clear_stale()
        try:
            home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JobDirError(f"cannot create {home}: {exc.strerror}") from None
        record = JobRecord(
            name=name,
            pipeline=pipeline,
            params=dict(params),
            overrides=overrides or SettingsOverrides(),
            config_file=str(config_file.resolve()) if config_file else None,
            started_at=iso(datetime.now(UTC)),
            real_time=real_time,
        )
        record.save(home / "job.json")
        argv = [sys.executable, "-m", "kappaflow.jobs.runner", f"--kappaflow-job={home}"]
        env = {**os.environ, **spark_environment(self.settings, os.environ)}
        # The driver records its own pid and state from here on.
        pid = process.spawn(argv, log_file=home / "driver.log", env=env)
        if wait:
            return self._wait_running(name, pid, timeout)
        record.pid = pid
        return record

    def _wait_running(self, name: str, pid: int, timeout: float) -> JobRecord:
        home = self.job_dir(name)
        process = self._process(name)

        def running() -> JobRecord | None:
            record = JobRecord.load(home / "job.json")
            if record.state in (JobState.RUNNING, JobState.FINISHED):
                return record
            if record.state is JobState.FAILED:
                raise JobStartError(f"job {name!r} failed to start: {record.error}")
            if process.exited(pid):
                last = tail(home / "driver.log", 1)
                raise JobStartError(
                    f"job {name!r} exited during start-up: {last[-1] if last else '?'} "
                    f"(log: {home / 'driver.log'})"
                )
            return None

        try:
            return wait_for(running, timeout=timeout, interval=0.5, what=f"job {name} to start")
        except TimeoutError:
            # Not left to come up later behind the caller's back: it was reported as failed.
            with contextlib.suppress(JobError):  # unless it has just exited by itself
                self.stop(name)
            raise JobStartTimeoutError(
                f"job {name!r} did not start within {timeout:.0f}s and was stopped "
                f"(log: {home / 'driver.log'})"
            ) from None

    def get(self, name: str) -> JobRecord:
        path = self.job_dir(name) / "job.json"
        if not path.exists():
            raise JobNotFoundError(f"no job named {name!r} (see `kappaflow jobs list`)")
        record = JobRecord.load(path)
        if (
            record.state in ACTIVE_STATES
            and self._process(name).status().state is not ProcState.RUNNING
        ):
            record.state = JobState.CRASHED
        return record

    def get_state(self, name: str) -> JobState:
        """The job's state, ``ABSENT`` if no job of that name was ever started."""
        if not (self.job_dir(name) / "job.json").exists():
            return JobState.ABSENT
        return self.get(name).state

    def records(self) -> list[JobRecord]:
        if not self.root.exists():
            return []
        names = sorted(p.parent.name for p in self.root.glob("*/job.json"))
        return [self.get(name) for name in names]

    def stop(self, name: str, *, timeout: float = STOP_TIMEOUT_S) -> JobRecord:
        """Stop the job gracefully (its queries finish their batch), forcefully after timeout."""
        record = self.get(name)
        process = self._process(name)
        if process.status().state is not ProcState.RUNNING:
            process.clear_stale()
            raise JobNotRunningError(f"job {name!r} is not running (state: {record.state})")
        process.stop(timeout=timeout, sig=signal.SIGTERM)
        record = JobRecord.load(self.job_dir(name) / "job.json")
        if record.state in ACTIVE_STATES:
            # The driver did not get to record its end: it was killed after the timeout.
            record.state = JobState.KILLED
            record.ended_at = iso(datetime.now(UTC))
            record.save(self.job_dir(name) / "job.json")
        return record

    def is_running(self, name: str) -> bool:
        """Whether a driver of the job runs."""
        return self._process(name).status().state is ProcState.RUNNING

    def check_stopped(self, name: str) -> None:
        """Raise unless no driver of the job runs (a job that is absent runs none)."""
        if self._process(name).status().state is ProcState.RUNNING:
            raise JobRunningError(f"job {name!r} is running: stop it first (`kappaflow jobs stop`)")

    def remove(self, name: str) -> list[str]:
        """Forget a job that is not running: its record, logs and checkpoint. Started
        again under the same name, it begins from nothing instead of resuming.

        The checkpoint goes from ``<state_dir>/checkpoints`` (kappaflow's own pipelines)
        and from ``checkpoint_dir`` (jobs on the job API) when that is a local path or a
        ``file:`` URI. Returns the checkpoints left where this machine cannot delete:
        under a URI of another file system (``hdfs://``, ``s3a://``)."""
        self.get(name)
        self.check_stopped(name)
        shutil.rmtree(self.settings.checkpoint_root / name, ignore_errors=True)
        location = f"{self.settings.checkpoint_location.rstrip('/')}/{name}"
        local = local_path(location)
        if local is not None:
            shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(self.job_dir(name))
        return [location] if local is None else []

    def progress(self, name: str) -> dict[str, Any]:
        """The last progress of each of the job's queries, its parts' included."""
        found: dict[str, Any] = {}
        home = self.job_dir(name)
        for path in [home / "progress.json", *sorted(home.glob("progress.*.json"))]:
            try:
                found.update(json.loads(path.read_text()))
            except (FileNotFoundError, json.JSONDecodeError):
                continue
        return found

    def plan(self, name: str) -> dict[str, Any]:
        """The job's sources, tables and outputs as its drivers declared them when they
        last started (empty lists for a job that records none)."""
        merged: dict[str, Any] = {"job": name, "sources": [], "tables": [], "outputs": []}
        home = self.job_dir(name)
        for path in [home / PLAN, *sorted(home.glob("plan.*.json"))]:
            try:
                plan = json.loads(path.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            for part in ("sources", "tables", "outputs"):
                merged[part] += plan.get(part, [])
        return merged

    def log_lines(self, name: str, lines: int = 50) -> list[str]:
        self.get(name)
        return tail(self.job_dir(name) / "driver.log", lines)
