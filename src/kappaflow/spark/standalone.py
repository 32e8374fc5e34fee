"""A Spark standalone cluster on this machine: a master and N workers, each a JVM of its
own started from PySpark's own distribution (``bin/spark-class``; the pip package has the
classes but not the ``sbin`` scripts).

Everything lives under ``<state_dir>/spark``: the daemons' pid files, logs and the
workers' directories (where executors run, and the job's shipped code lands). Master and
workers listen on ``spark.cluster_host`` (loopback by default). Jobs run there when
``spark.master`` names the master, ``spark://HOST:PORT`` (``kappaflow spark start``
prints it).
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kappaflow.errors import (
    PortInUseError,
    ServiceExitedError,
    ServiceStartTimeoutError,
    StateDirError,
)
from kappaflow.install.jdk import find_java
from kappaflow.procs import ManagedProcess, ProcState, port_held, tail
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


@dataclass(frozen=True)
class DaemonStatus:
    name: str
    state: ProcState
    pid: int | None


@dataclass(frozen=True)
class ClusterStatus:
    master_url: str
    ui_url: str
    daemons: list[DaemonStatus]
    #: What the master says, when it answers: alive workers, their cores, the apps.
    alive_workers: int | None
    cores: int | None
    apps: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "master": self.master_url,
            "ui": self.ui_url,
            "alive_workers": self.alive_workers,
            "cores": self.cores,
            "apps": self.apps,
            "daemons": [
                {"name": d.name, "state": d.state.value, "pid": d.pid} for d in self.daemons
            ],
        }


class StandaloneCluster:
    """Start, stop and inspect the state directory's standalone master and workers."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = (settings.state_dir / "spark").resolve()
        spark = settings.spark
        self.host = spark.cluster_host
        self.port = spark.cluster_port
        self.ui_port = spark.cluster_ui_port

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    def _daemon(self, name: str) -> ManagedProcess:
        # Its properties file names it on its command line from the start (spark-class
        # is a shell script until it execs the JVM).
        return ManagedProcess(f"Spark {name}", self.home / f"{name}.pid", (str(self._conf(name)),))

    def _conf(self, name: str) -> Path:
        return self.home / f"{name}.conf"

    def _workers(self) -> list[str]:
        """The workers that have pid files, in order."""
        found = sorted(self.home.glob("worker-*.pid"), key=lambda p: int(p.stem.split("-")[1]))
        return [p.stem for p in found]

    def start(
        self, workers: int, *, cores: int, memory: str, timeout: float = START_TIMEOUT_S
    ) -> list[str]:
        """Start the master and ``workers`` workers where they do not run; wait until the
        master counts them alive. Say what was done."""
        done: list[str] = []
        self._prepare()
        master = self._daemon("master")
        master.clear_stale()
        if master.status().state is not ProcState.RUNNING:
            for port in (self.port, self.ui_port):
                if port_held(self.host, port):
                    raise PortInUseError(
                        f"port {self.host}:{port} is already in use: stop what holds it or "
                        "choose others (KAPPAFLOW_SPARK__CLUSTER_PORT, "
                        "KAPPAFLOW_SPARK__CLUSTER_UI_PORT)"
                    )
            self._spawn(
                master,
                "master",
                [MASTER_CLASS, "--host", self.host, "--port", str(self.port),
                 "--webui-port", str(self.ui_port)],
            )  # fmt: skip
            self._wait(lambda: self._master_json() is not None, master, "master", timeout)
            done.append(f"spark master started on {self.master_url} (ui {self.ui_url})")
        else:
            done.append(f"spark master already running on {self.master_url}")
        for n in range(1, workers + 1):
            worker = self._daemon(f"worker-{n}")
            worker.clear_stale()
            if worker.status().state is ProcState.RUNNING:
                continue
            work_dir = self.home / f"worker-{n}"
            self._spawn(
                worker,
                f"worker-{n}",
                [WORKER_CLASS, self.master_url, "--host", self.host, "--cores", str(cores),
                 "--memory", memory, "--webui-port", "0", "--work-dir", str(work_dir)],
            )  # fmt: skip
            done.append(f"spark worker-{n} started ({cores} cores, {memory})")

        def registered() -> bool:
            state = self._master_json()
            return state is not None and int(state.get("aliveworkers", 0)) >= workers

        self._wait(registered, master, "workers to register", timeout)
        return done

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> list[str]:
        """Stop the workers, then the master; say what was done."""
        done: list[str] = []
        for name in [*self._workers(), "master"]:
            daemon = self._daemon(name)
            daemon.clear_stale()
            stopped = daemon.stop(timeout=timeout)
            done.append(f"spark {name} {'stopped' if stopped else 'was not running'}")
        return done

    def status(self) -> ClusterStatus:
        daemons = [
            DaemonStatus(name, *_state(self._daemon(name))) for name in ["master", *self._workers()]
        ]
        state = self._master_json() if daemons[0].state is ProcState.RUNNING else None
        return ClusterStatus(
            self.master_url,
            self.ui_url,
            daemons,
            int(state.get("aliveworkers", 0)) if state else None,
            int(state.get("cores", 0)) if state else None,
            [str(app.get("name")) for app in state.get("activeapps", [])] if state else [],
        )

    def worker_pid(self, n: int) -> int | None:
        """The pid of worker ``n`` (1-based), if it runs."""
        return self._daemon(f"worker-{n}").status().pid

    def _prepare(self) -> None:
        try:
            self.home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateDirError(f"cannot create {self.home} ({exc.strerror})") from None

    def _spawn(self, daemon: ManagedProcess, name: str, args: list[str]) -> None:
        import pyspark

        spark_home = Path(pyspark.__file__).parent
        java = find_java()
        conf = self._conf(name)
        # The workers clean what finished applications left in their directories.
        conf.write_text("spark.worker.cleanup.enabled true\n")
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home),
            "JAVA_HOME": str(java.executable.resolve().parent.parent),
            "SPARK_LOG_DIR": str(self.home),
            "SPARK_LOCAL_IP": self.host,
            "SPARK_DAEMON_MEMORY": self.settings.spark.cluster_daemon_memory,
            # Executors' Python workers: this interpreter, where kappaflow is installed.
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", _python()),
        }
        daemon.spawn(
            [str(spark_home / "bin" / "spark-class"), *args, "--properties-file", str(conf)],
            log_file=self.home / f"{name}.log",
            env=env,
        )

    def _wait(self, ready: Any, daemon: ManagedProcess, what: str, timeout: float) -> None:
        pid = daemon.status().pid

        def check() -> bool | None:
            if pid is None or daemon.exited(pid):
                last = tail(self.home / "master.log", 3)
                raise ServiceExitedError(
                    f"the Spark master exited while waiting for {what}: "
                    + (last[-1] if last else f"see {self.home}")
                )
            return True if ready() else None

        try:
            wait_for(check, timeout=timeout, interval=0.5, what=f"the Spark {what}")
        except TimeoutError:
            raise ServiceStartTimeoutError(
                f"the Spark {what} did not come within {timeout:.0f}s; see {self.home}"
            ) from None

    def _master_json(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=3) as answer:
                found: dict[str, Any] = json.loads(answer.read())
                return found
        except (OSError, ValueError):
            return None


def _state(daemon: ManagedProcess) -> tuple[ProcState, int | None]:
    status = daemon.status()
    return status.state, status.pid


def _python() -> str:
    import sys

    return sys.executable
