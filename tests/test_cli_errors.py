"""Misuse and broken environments: one clear line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

from pathlib import Path

from conftest import error_line, executable, run_kappaflow

from kappaflow.procs import free_port
from kappaflow.settings import Settings


def test_unknown_command_and_flag(offline: Settings) -> None:
    assert "No such command" in error_line(run_kappaflow(offline, "frobnicate"), "KF001", 2)
    assert "No such option" in error_line(
        run_kappaflow(offline, "topics", "list", "--nope"), "KF001", 2
    )
    assert "Missing argument" in error_line(run_kappaflow(offline, "produce"), "KF001", 2)


def test_missing_broker(offline: Settings) -> None:
    env = {"KAPPAFLOW_KAFKA__TIMEOUT_S": "3"}
    line = error_line(run_kappaflow(offline, "topics", "list", env=env), "KF401", 1)
    assert "cannot reach Kafka" in line and "kappaflow kafka start" in line
    external = {**env, "KAPPAFLOW_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}
    line = error_line(
        run_kappaflow(offline, "consume", "x", "--from-beginning", env=external), "KF401", 1
    )
    assert "cannot reach Kafka" in line


def test_invalid_setting(offline: Settings) -> None:
    line = error_line(
        run_kappaflow(offline, "status", env={"KAPPAFLOW_KAFKA__PORT": "ninety"}), "KF101", 2
    )
    assert "kafka.port" in line


def test_state_dir_not_writable(offline: Settings, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_kappaflow(
        offline, "kafka", "start", env={"KAPPAFLOW_STATE_DIR": str(blocker / "state")}
    )
    assert "not writable" in error_line(result, "KF302", 1)


def test_java_too_old(offline: Settings, tmp_path: Path) -> None:
    jdk = tmp_path / "jdk11"
    executable(jdk / "bin" / "java", "echo 'openjdk version \"11.0.21\" 2023-10-17' >&2")
    result = run_kappaflow(offline, "kafka", "start", env={"JAVA_HOME": str(jdk)})
    line = error_line(result, "KF202", 1)
    assert "Java 11.0.21" in line and "too old" in line


def test_jars_not_resolved(offline: Settings, tmp_path: Path) -> None:
    result = run_kappaflow(
        offline, "kafka", "start", env={"KAPPAFLOW_JARS_DIR": str(tmp_path / "no-jars")}
    )
    assert "make setup" in error_line(result, "KF203", 1)


def test_unknown_job_and_pipeline(offline: Settings) -> None:
    assert "no job named" in error_line(run_kappaflow(offline, "jobs", "stop", "ghost"), "KF601", 1)
    line = error_line(
        run_kappaflow(offline, "jobs", "start", "j1", "--pipeline", "nope"), "KF603", 1
    )
    assert "unknown pipeline" in line
    line = error_line(
        run_kappaflow(offline, "jobs", "start", "bad/name", "--pipeline", "clean"), "KF602", 1
    )
    assert "invalid job name" in line
