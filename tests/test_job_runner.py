"""The job driver's own decisions, with the session and the pipeline stood in for."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from kappaflow.jobs import runner
from kappaflow.jobs.contract import JobContext, Part, Pipeline
from kappaflow.jobs.manager import JobRecord, JobState
from kappaflow.jobs.parts import PartProcesses
from kappaflow.settings import Settings


class _Session:
    def stop(self) -> None:
        pass


@pytest.mark.parametrize("asked", [False, True])
def test_a_stop_asked_while_the_queries_start_starts_no_part_and_never_runs(
    offline: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: bool
) -> None:
    stop = threading.Event()
    parts_started: list[list[str]] = []
    states: list[JobState] = []

    class Starting:
        main = True

        def start(self, ctx: JobContext) -> list[Any]:
            if asked:
                stop.set()  # as SIGTERM does while a query starts
            return []

        def parts(self, params: Any, settings: Settings) -> list[Part]:
            return [Part("realtime")]

    def start_parts(self: PartProcesses, timeout: float) -> None:
        parts_started.append(self.names)
        stop.set()  # the job then stops at once

    monkeypatch.setattr(runner, "load_pipeline", lambda _reference: Starting())
    monkeypatch.setattr(runner, "_settings", lambda _record: offline)
    monkeypatch.setattr("kappaflow.spark.session.build_session", lambda *_a, **_k: _Session())
    monkeypatch.setattr(PartProcesses, "start", start_parts)
    monkeypatch.setattr(PartProcesses, "stop", lambda self, timeout: None)
    monkeypatch.setattr(JobRecord, "save", lambda self, path: states.append(self.state))

    record = JobRecord(name="j", pipeline="p", params={})
    assert runner._run(record, tmp_path / "job.json", tmp_path, stop) == 0
    if asked:
        assert (parts_started, states) == ([], [JobState.STOPPED])
    else:
        assert (parts_started, states) == ([["realtime"]], [JobState.RUNNING, JobState.STOPPED])


@pytest.mark.parametrize("main", [True, False])
def test_a_job_whose_queries_all_run_in_parts_starts_no_session_and_runs_until_stopped(
    offline: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, main: bool
) -> None:
    stop = threading.Event()
    sessions: list[str] = []
    started: list[str | None] = []
    states: list[JobState] = []

    def start(ctx: JobContext) -> list[Any]:
        started.append(ctx.part)
        return []

    def session(*_args: Any, app_name: str = "", **_kwargs: Any) -> _Session:
        sessions.append(app_name)
        return _Session()

    def watch(queries: list[Any], *_args: Any, **_kwargs: Any) -> tuple[JobState, None]:
        stop.set()
        return JobState.STOPPED, None

    pipeline = Pipeline(start=start, parts=lambda _p, _s: [Part("score")], main=main)
    monkeypatch.setattr(runner, "load_pipeline", lambda _reference: pipeline)
    monkeypatch.setattr(runner, "_settings", lambda _record: offline)
    monkeypatch.setattr("kappaflow.spark.session.build_session", session)
    monkeypatch.setattr(runner, "_watch", watch)
    monkeypatch.setattr(PartProcesses, "start", lambda self, timeout: None)
    monkeypatch.setattr(PartProcesses, "stop", lambda self, timeout: None)
    monkeypatch.setattr(JobRecord, "save", lambda self, path: states.append(self.state))

    record = JobRecord(name="j", pipeline="p", params={})
    assert runner._run(record, tmp_path / "job.json", tmp_path, stop) == 0
    assert states == [JobState.RUNNING, JobState.STOPPED]
    if main:
        assert (sessions, started) == (["kappaflow:j"], [None])
    else:
        assert (sessions, started) == ([], [])
