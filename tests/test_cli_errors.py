"""Misuse and broken environments: one clear line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import Result, free_port, make_settings, run_kappaflow
from kappaflow.settings import Settings


@pytest.fixture
def offline(tmp_path: Path) -> Settings:
    """Settings whose broker is not running (nothing listens on its port)."""
    return make_settings(tmp_path / "state")


def one_line_error(result: Result, error: str, code: int) -> str:
    """The one stderr line of a failure with error code ``error`` and exit status ``code``."""
    assert "Traceback" not in result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err
    assert lines[0].startswith(f"kappaflow: error[{error}]: "), lines[0]
    assert result.code == code
    return lines[0]


def test_unknown_command_and_flag(offline: Settings) -> None:
    assert "No such command" in one_line_error(run_kappaflow(offline, "frobnicate"), "KF001", 2)
    assert "No such option" in one_line_error(
        run_kappaflow(offline, "topics", "list", "--nope"), "KF001", 2
    )
    assert "Missing argument" in one_line_error(run_kappaflow(offline, "produce"), "KF001", 2)


def test_missing_broker(offline: Settings) -> None:
    env = {"KAPPAFLOW_KAFKA__TIMEOUT_S": "3"}
    line = one_line_error(run_kappaflow(offline, "topics", "list", env=env), "KF401", 1)
    assert "cannot reach Kafka" in line and "kappaflow kafka start" in line
    external = {**env, "KAPPAFLOW_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}
    line = one_line_error(
        run_kappaflow(offline, "consume", "x", "--from-beginning", env=external), "KF401", 1
    )
    assert "cannot reach Kafka" in line


def test_invalid_setting(offline: Settings) -> None:
    line = one_line_error(
        run_kappaflow(offline, "status", env={"KAPPAFLOW_KAFKA__PORT": "ninety"}), "KF101", 2
    )
    assert "kafka.port" in line


def test_state_dir_not_writable(offline: Settings, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_kappaflow(
        offline, "kafka", "start", env={"KAPPAFLOW_STATE_DIR": str(blocker / "state")}
    )
    assert "not writable" in one_line_error(result, "KF302", 1)


def test_java_too_old(offline: Settings, tmp_path: Path) -> None:
    fake = tmp_path / "jdk11" / "bin"
    fake.mkdir(parents=True)
    java = fake / "java"
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.21\" 2023-10-17' >&2\n")
    java.chmod(0o755)
    result = run_kappaflow(offline, "kafka", "start", env={"JAVA_HOME": str(fake.parent)})
    line = one_line_error(result, "KF202", 1)
    assert "Java 11.0.21" in line and "too old" in line


def test_jars_not_resolved(offline: Settings, tmp_path: Path) -> None:
    result = run_kappaflow(
        offline, "kafka", "start", env={"KAPPAFLOW_JARS_DIR": str(tmp_path / "no-jars")}
    )
    assert "make setup" in one_line_error(result, "KF203", 1)


def test_unknown_job_and_pipeline(offline: Settings) -> None:
    assert "no job named" in one_line_error(
        run_kappaflow(offline, "jobs", "stop", "ghost"), "KF601", 1
    )
    line = one_line_error(
        run_kappaflow(offline, "jobs", "start", "j1", "--pipeline", "nope"), "KF603", 1
    )
    assert "unknown pipeline" in line
    line = one_line_error(
        run_kappaflow(offline, "jobs", "start", "bad/name", "--pipeline", "clean"), "KF602", 1
    )
    assert "invalid job name" in line
