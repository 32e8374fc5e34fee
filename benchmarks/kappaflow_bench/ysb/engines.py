"""The engines a YSB run can drive: kappaflow's Spark job, and peers.

Each is started before the warm-up and stopped after the run, and cleans up what it
created (checkpoints, internal topics, state).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import psutil

import kappaflow
import kappaflow_bench
from kappaflow.errors import JobError, KappaflowError, SetupError, TopicNotFoundError
from kappaflow.install.artifacts import JarSet, resolve
from kappaflow.jobs.manager import ACTIVE_STATES, JobManager
from kappaflow.jobs.removal import remove_job
from kappaflow.kafka.topics import create_topic, delete_topic, list_topics
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.waiting import wait_for

#: The Quix Streams release the peer runs, in a virtual environment of its own.
QUIX_VERSION = "3.28.1"
#: The PyFlink release: the newest with a Kafka connector on Maven Central (5.0.0-2.2).
FLINK_VERSION = "2.2.1"
#: The original job's parallelism was hosts x cores: 2 here.
FLINK_PARALLELISM = 2
STOP_TIMEOUT_S = 60.0
#: Flink's Kafka SQL connector (poms/flink-kafka.xml), resolved from Maven Central the
#: way ``kappaflow setup`` resolves kappaflow's own jars, when a Flink run first needs it.
FLINK_CONNECTOR = JarSet(
    "flink", "flink-kafka.xml", ("flink-sql-connector-kafka",), package="kappaflow_bench.ysb"
)


def flink_connector_jars(settings: Settings) -> list[Path]:
    """Flink's Kafka connector jars, resolved on first use."""
    resolve(settings, (FLINK_CONNECTOR,))
    return FLINK_CONNECTOR.jars(settings)


class Engine(Protocol):
    def start(self) -> None: ...

    def stop(self, log_to: Path) -> None:
        """Stop, clean up, and keep the engine's log at ``log_to``."""
        ...

    def versions(self) -> dict[str, str]: ...

    def pid(self) -> int | None:
        """The engine's process (its job's driver, its app), while it runs."""
        ...


def cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds (user and system) a process and its descendants have used so far:
    those running, and those that ended and were waited for (in their parent's
    ``children_*`` times). None when the process is gone."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        total = 0.0
        for proc in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.NoSuchProcess):
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        return total
    except psutil.NoSuchProcess:
        return None


class SparkEngine:
    """The hand-written ``ysb`` pipeline (pipeline.py) as a kappaflow job, in
    micro-batch (``spark``) or real-time mode (``spark-rt``)."""

    def __init__(
        self, settings: Settings, name: str, params: dict[str, str], overrides: SettingsOverrides
    ) -> None:
        self.settings = settings
        self.name = name
        self.params = params
        self.overrides = overrides
        self.jobs = JobManager(settings)

    def start(self) -> None:
        self.jobs.start(
            self.name,
            "kappaflow_bench.ysb.pipeline:PIPELINE",
            self.params,
            overrides=self.overrides,
        )

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

    def pid(self) -> int | None:
        return self.jobs.get(self.name).pid


class ApiEngine:
    """The YSB job on kappaflow's job API (ysb/job.py), started as ``kappaflow jobs
    start NAME --app kappaflow_bench.ysb.job:build`` starts a user's job; stopped, it is
    removed as ``kappaflow jobs remove`` removes one (checkpoint, ``JOB.*`` topics,
    serving-store keys)."""

    app = "kappaflow_bench.ysb.job:build"

    def __init__(
        self, settings: Settings, name: str, params: dict[str, str], overrides: SettingsOverrides
    ) -> None:
        self.settings = settings
        self.name = name
        self.params = params
        self.overrides = overrides
        self.jobs = JobManager(settings)

    def start(self) -> None:
        self.jobs.start(self.name, self.app, self.params, overrides=self.overrides)

    def stop(self, log_to: Path) -> None:
        if self.jobs.get_state(self.name) in ACTIVE_STATES:
            self.jobs.stop(self.name)
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(self.jobs.job_dir(self.name) / "driver.log", log_to)
        with contextlib.suppress(KappaflowError):
            remove_job(self.settings, self.name)

    def versions(self) -> dict[str, str]:
        import pyspark

        return {"engine": f"pyspark {pyspark.__version__}", "kappaflow": kappaflow.__version__}

    def pid(self) -> int | None:
        return self.jobs.get(self.name).pid


class AppEngine:
    """A peer's job: ``python -m <module>`` in a virtual environment of its own under
    ``<state_dir>/engines/<kind>``, made on first use, its run's description as JSON on
    stdin. Peers pin dependencies kappaflow cannot share (an older confluent-kafka for
    Quix Streams, old numpy, pandas and protobuf for PyFlink), hence a venv each.

    The app prints ``<kind> app running`` once its job is running, and stops on SIGTERM.
    """

    kind: str
    label: str
    module: str
    packages: tuple[str, ...]
    start_timeout_s = 120.0

    def __init__(self, settings: Settings, name: str, spec: dict[str, Any]) -> None:
        self.settings = settings
        self.name = name
        self.home = (settings.state_dir / "engines" / self.kind).resolve()
        self.spec = spec
        #: Seconds the last ``install`` took; None when the venv was there already.
        self.install_s: float | None = None
        self._proc: subprocess.Popen[str] | None = None

    @property
    def python(self) -> Path:
        return self.home / "venv" / "bin" / "python"

    @property
    def log(self) -> Path:
        return self.home / f"{self.name}.log"

    def install(self) -> None:
        """The app's virtual environment with its packages, made once."""
        if self.python.exists():
            return
        began = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        venv = self.home / "venv"
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [str(self.python), "-m", "pip", "install", "--quiet", *self.packages],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                last = (done.stderr.strip().splitlines() or ["?"])[-1]
                raise SetupError(f"cannot install {self.label} in {venv}: {last}")
        self.install_s = round(time.monotonic() - began, 1)

    def app_env(self) -> dict[str, str]:
        # The benchmarks' sources (the Redis layout, the workload's constants) and
        # kappaflow's, which they import; the few of their dependencies that the apps
        # import are in the apps' venvs.
        roots = (Path(m.__file__ or "").resolve().parents[1] for m in (kappaflow_bench, kappaflow))
        return {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, roots))}

    def start(self) -> None:
        self.install()
        with open(self.log, "w") as log:
            # A session of its own: stop() can then end whatever the app started (the
            # JVM PyFlink launches) without touching anything else.
            self._proc = subprocess.Popen(
                [str(self.python), "-m", self.module],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                env=self.app_env(),
                start_new_session=True,
            )
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(self.spec))
        self._proc.stdin.close()
        wait_for(
            lambda: True if self._running() else None,
            timeout=self.start_timeout_s,
            interval=0.2,
            what=f"the {self.label} app to start",
        )

    def _running(self) -> bool:
        assert self._proc is not None
        log = self.log.read_text()
        if self._proc.poll() is not None:
            last = (log.strip().splitlines() or ["?"])[-1]
            raise JobError(f"the {self.label} app exited: {last}")
        return f"{self.kind} app running" in log

    def stop(self, log_to: Path) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None:
            # Whatever the app left behind in its session (its process group).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.clean_up()
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(self.log, log_to)
            self.log.unlink()

    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def clean_up(self) -> None:
        """Remove what the app created for this run (topics, state)."""

    def describe(self) -> dict[str, Any]:
        """The app's configuration for the run's result, and what installing it took."""
        return {} if self.install_s is None else {"install_s": self.install_s}


class QuixEngine(AppEngine):
    """The same job on Quix Streams (``kappaflow_bench.ysb.quix_app``), a process of its own."""

    kind = "quix"
    label = "Quix Streams"
    module = "kappaflow_bench.ysb.quix_app"
    packages = (f"quixstreams=={QUIX_VERSION}", "redis>=5")

    def __init__(self, settings: Settings, name: str, spec: dict[str, Any]) -> None:
        super().__init__(settings, name, spec)
        self.spec = {
            **spec,
            "group": name,
            "client_config": settings.kafka.client_config(),
            "redis_url": settings.redis.effective_url,
            "state_dir": str(self.home / "state" / name),
        }

    def clean_up(self) -> None:
        # Quix's repartition and changelog topics carry the consumer group's name.
        for row in list_topics(self.settings.kafka):
            if self.name in str(row["name"]):
                with contextlib.suppress(TopicNotFoundError):
                    delete_topic(self.settings.kafka, str(row["name"]))
        shutil.rmtree(self.home / "state" / self.name, ignore_errors=True)

    def versions(self) -> dict[str, str]:
        return {"engine": f"quixstreams {QUIX_VERSION}"}


class FlinkEngine(AppEngine):
    """The same job on Apache Flink, driven from PyFlink (``kappaflow_bench.ysb.flink_app``):
    Flink SQL in a local mini-cluster, a JVM the app process starts."""

    kind = "flink"
    label = "PyFlink"
    module = "kappaflow_bench.ysb.flink_app"
    # confluent-kafka and pydantic for the relay to Redis (kappaflow_bench.ysb.relay).
    packages = (
        f"apache-flink=={FLINK_VERSION}",
        "redis>=5",
        "confluent-kafka>=2.16,<3",
        "pydantic>=2.7,<3",
        "pydantic-settings>=2.4,<3",
    )
    #: A cold mini-cluster on a busy machine takes 20 to 60 s to run its job.
    start_timeout_s = 240.0

    def __init__(
        self, settings: Settings, name: str, spec: dict[str, Any], *, partitions: int
    ) -> None:
        super().__init__(settings, name, spec)
        self.partitions = partitions
        self.spec = {
            **spec,
            "group": name,
            "kafka_options": settings.kafka.spark_kafka_options(),
            "client_config": settings.kafka.client_config(),
            "redis_url": settings.redis.effective_url,
            "relay_topic": f"{name}.windows",
            "parallelism": FLINK_PARALLELISM,
            # The original: the source's parallelism is at most the topic's partitions.
            "source_parallelism": min(FLINK_PARALLELISM, partitions),
            "tmp_dir": str(self.home / "state" / name),
        }

    def start(self) -> None:
        jars = flink_connector_jars(self.settings)
        self.spec["jars"] = [jar.resolve().as_uri() for jar in jars]
        Path(self.spec["tmp_dir"]).mkdir(parents=True, exist_ok=True)
        if self.spec["sink"] == "redis":
            create_topic(
                self.settings.kafka,
                self.spec["relay_topic"],
                partitions=self.partitions,
                exist_ok=True,
            )
        super().start()

    def app_env(self) -> dict[str, str]:
        # Flink's own log (the mini-cluster's) beside the app's; its default is inside
        # the installed package.
        return {**super().app_env(), "FLINK_LOG_DIR": self.spec["tmp_dir"]}

    def stop(self, log_to: Path) -> None:
        super().stop(log_to)
        # Flink's own log (the JVM's) beside the app's, then the run's directory.
        tmp = Path(self.spec["tmp_dir"])
        for flink_log in sorted(tmp.glob("*.log"))[-1:]:
            shutil.copyfile(flink_log, log_to.with_name("flink.log"))
        shutil.rmtree(tmp, ignore_errors=True)

    def describe(self) -> dict[str, Any]:
        from kappaflow_bench.ysb import flink_app

        return {
            **super().describe(),
            "parallelism": self.spec["parallelism"],
            "source_parallelism": self.spec["source_parallelism"],
            "early_fire": flink_app.EARLY_FIRE,
            "watermark_delay_s": flink_app.WATERMARK_DELAY_S,
            "checkpointing": "off",
            "mode": "local mini-cluster",
        }

    def versions(self) -> dict[str, str]:
        found = re.search(r"<version>([^<]+)</version>\s*</dependency>", FLINK_CONNECTOR.pom_text())
        connector = found.group(1) if found else "?"
        return {"engine": f"pyflink {FLINK_VERSION}", "flink_kafka_connector": connector}

    def clean_up(self) -> None:
        with contextlib.suppress(TopicNotFoundError):
            delete_topic(self.settings.kafka, self.spec["relay_topic"])
