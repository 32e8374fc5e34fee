"""The engines a YSB run can drive: kappaflow's Spark job, and peers.

Each is started before the warm-up and stopped after the run, and cleans up what it
created (checkpoints, internal topics, state).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

import kappaflow
from kappaflow.errors import JobError, SetupError, TopicNotFoundError
from kappaflow.kafka.topics import delete_topic, list_topics
from kappaflow.procs import wait_for
from kappaflow.settings import Settings
from kappaflow.spark.jobs import JobManager

#: The Quix Streams release the peer runs, in a virtual environment of its own.
QUIX_VERSION = "3.28.1"
STOP_TIMEOUT_S = 60.0


class Engine(Protocol):
    def start(self) -> None: ...

    def stop(self, log_to: Path) -> None:
        """Stop, clean up, and keep the engine's log at ``log_to``."""
        ...

    def versions(self) -> dict[str, str]: ...


class SparkEngine:
    """The ``ysb`` pipeline as a kappaflow job (micro-batch or real-time mode)."""

    def __init__(
        self, settings: Settings, name: str, params: dict[str, str], overrides: dict[str, Any]
    ) -> None:
        self.settings = settings
        self.name = name
        self.params = params
        self.overrides = overrides
        self.jobs = JobManager(settings)

    def start(self) -> None:
        self.jobs.start(self.name, "ysb", self.params, overrides=self.overrides)

    def stop(self, log_to: Path) -> None:
        if self.jobs.get_state(self.name) in ("running", "starting"):
            self.jobs.stop(self.name)
        home = self.jobs.job_dir(self.name)
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(home / "driver.log", log_to)
        shutil.rmtree(home, ignore_errors=True)
        # The real-time job's relay topic exists only in that mode.
        with contextlib.suppress(TopicNotFoundError):
            delete_topic(self.settings.kafka, f"{self.name}.windows")
        shutil.rmtree(self.settings.checkpoint_root / self.name, ignore_errors=True)

    def versions(self) -> dict[str, str]:
        import pyspark

        return {"engine": f"pyspark {pyspark.__version__}"}


class QuixEngine:
    """The same job on Quix Streams (``kappaflow.ysb.quix_app``), a process of its own."""

    def __init__(self, settings: Settings, name: str, spec: dict[str, Any]) -> None:
        self.settings = settings
        self.name = name
        self.home = (settings.state_dir / "engines" / "quix").resolve()
        self.spec = {
            **spec,
            "group": name,
            "client_config": settings.kafka.client_config(),
            "redis_url": settings.redis.effective_url,
            "state_dir": str(self.home / "state" / name),
        }
        self._proc: subprocess.Popen[str] | None = None

    @property
    def python(self) -> Path:
        return self.home / "venv" / "bin" / "python"

    def install(self) -> None:
        """A virtual environment with Quix Streams, made once: it pins an older
        confluent-kafka than kappaflow, so it cannot share kappaflow's."""
        if self.python.exists():
            return
        self.home.mkdir(parents=True, exist_ok=True)
        venv = self.home / "venv"
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [
                str(self.python),
                *("-m", "pip", "install", "--quiet"),
                *(f"quixstreams=={QUIX_VERSION}", "redis>=5"),
            ],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                last = (done.stderr.strip().splitlines() or ["?"])[-1]
                raise SetupError(f"cannot install Quix Streams in {venv}: {last}")

    def start(self) -> None:
        self.install()
        # kappaflow's own sources, for the Redis layout; the few of its dependencies
        # that the app imports (pydantic, pydantic-settings) come with Quix Streams.
        src = str(Path(kappaflow.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": src}
        with open(self.home / f"{self.name}.log", "w") as log:
            self._proc = subprocess.Popen(
                [str(self.python), "-m", "kappaflow.ysb.quix_app"],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(self.spec))
        self._proc.stdin.close()
        wait_for(
            lambda: True if self._running() else None,
            timeout=120,
            interval=0.2,
            what="the Quix Streams app to start",
        )

    def _running(self) -> bool:
        assert self._proc is not None
        log = (self.home / f"{self.name}.log").read_text()
        if self._proc.poll() is not None:
            last = (log.strip().splitlines() or ["?"])[-1]
            raise JobError(f"the Quix Streams app exited: {last}")
        return "quix app running" in log

    def stop(self, log_to: Path) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        # Quix's repartition and changelog topics carry the consumer group's name.
        for row in list_topics(self.settings.kafka):
            if self.name in str(row["name"]):
                with contextlib.suppress(TopicNotFoundError):
                    delete_topic(self.settings.kafka, str(row["name"]))
        shutil.rmtree(self.home / "state" / self.name, ignore_errors=True)
        log = self.home / f"{self.name}.log"
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(log, log_to)
            log.unlink()

    def versions(self) -> dict[str, str]:
        return {"engine": f"quixstreams {QUIX_VERSION}"}
