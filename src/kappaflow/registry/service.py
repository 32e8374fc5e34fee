"""The embedded schema registry as a process of this state directory: start, stop,
status, logs (``kappaflow registry ...``). Its log and pid file live under
``<state_dir>/registry``; its schemas live in Kafka (server.py)."""

from __future__ import annotations

import os
import sys
from typing import Any

from kappaflow.errors import KafkaUnreachableError, PortInUseError, RegistryStartError
from kappaflow.kafka.clients import cluster_metadata
from kappaflow.procs import ManagedProcess, ProcState, port_held, tail
from kappaflow.registry.client import RegistryClient
from kappaflow.registry.server import SETTINGS_ENV
from kappaflow.settings import Settings, settings_json
from kappaflow.waiting import wait_for

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


class EmbeddedRegistry:
    """Start, stop and ask the schema registry of the state directory ``settings`` name."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = (settings.state_dir / "registry").resolve()
        self.log = self.home / "registry.log"
        # The home directory on the command line marks the process as this directory's.
        self.process = ManagedProcess(
            "schema registry", self.home / "registry.pid", (str(self.home),)
        )
        self.client = RegistryClient(settings.registry.url)

    @property
    def url(self) -> str:
        return self.settings.registry.url

    def start(self, *, timeout: float = START_TIMEOUT_S) -> bool:
        """Start the registry and wait until it answers, its schemas read from Kafka;
        False if it was running."""
        if self.process.status().state is ProcState.RUNNING:
            return False
        self.process.clear_stale()
        config = self.settings.registry
        try:
            cluster_metadata(self.settings.kafka)
        except KafkaUnreachableError as exc:
            raise RegistryStartError(
                f"Kafka at {self.settings.kafka.bootstrap} does not answer ({exc}): the "
                "registry keeps its schemas there; nothing was started"
            ) from None
        if port_held(config.host, config.port):
            raise PortInUseError(f"port {config.host}:{config.port} (registry.port) is in use")
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, SETTINGS_ENV: settings_json(self.settings)}
        argv = [sys.executable, "-m", "kappaflow.registry.server", str(self.home)]
        self.process.spawn(argv, log_file=self.log, env=env)
        pid = self.process.status().pid

        def ready() -> bool | None:
            if pid is None or self.process.exited(pid):
                last = [ln for ln in tail(self.log, 5) if ln]
                raise RegistryStartError(
                    "the schema registry exited during start-up: "
                    + (last[-1] if last else f"see {self.log}")
                )
            return True if self.client.answers() else None

        try:
            wait_for(ready, timeout=timeout, interval=0.2, what="the schema registry to answer")
        except TimeoutError:
            self.process.stop(timeout=5)
            raise RegistryStartError(
                f"the schema registry did not answer on {self.url} within {timeout:.0f}s; "
                f"see {self.log}"
            ) from None
        except BaseException:
            self.process.stop(timeout=5)
            raise
        return True

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Stop the registry; False if it was not running. Its schemas stay in Kafka."""
        self.process.clear_stale()
        return self.process.stop(timeout=timeout)

    def status(self) -> dict[str, Any]:
        """Whether it runs, its URL and its subjects."""
        proc = self.process.status()
        found: dict[str, Any] = {"state": str(proc.state), "pid": proc.pid, "url": self.url}
        if proc.state is ProcState.RUNNING and self.client.answers():
            found["subjects"] = self.client.subjects()
        return found

    def logs(self, lines: int = 50) -> list[str]:
        return tail(self.log, lines)
