"""The kappaflow service as a background process: ``kappaflow api start | stop | status``.

It is ``kappaflow api serve`` (uvicorn, in the foreground) started detached, given the
starting command's settings, resolved, in its environment (``SETTINGS_ENV``, secrets
included, as they would be in ``KAPPAFLOW_*`` variables); its pid file and log are under
``<state_dir>/api/``. It listens on ``api.host``:``api.port``, loopback by default;
until the service has API tokens (api/auth.py), an address other than loopback is
refused.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kappaflow.errors import (
    ApiBindRefusedError,
    PortInUseError,
    ServiceExitedError,
    ServiceStartTimeoutError,
)
from kappaflow.procs import ManagedProcess, ProcState, port_held, tail
from kappaflow.settings import Settings, settings_json
from kappaflow.waiting import wait_for

START_TIMEOUT_S = 60.0
#: The variable that hands the service its settings, as JSON.
SETTINGS_ENV = "KF_SERVICE_SETTINGS"
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ApiStatus:
    state: ProcState
    pid: int | None
    url: str
    started_at: float | None


def check_bind(settings: Settings) -> None:
    """Refuse an address other than loopback while the service has no API tokens: its
    answers hold every job's results, and it would give them to anyone."""
    from kappaflow.api.auth import TokenStore, loopback_host, tokens_path

    host = settings.api.host
    if not loopback_host(host) and not TokenStore(tokens_path(settings)).tokens():
        raise ApiBindRefusedError(
            f"the service would listen on {host}, beyond this machine, and it has no API "
            "tokens to refuse strangers with: create one (`kappaflow api token create "
            "NAME`) or keep api.host on loopback (127.0.0.1)"
        )


class EmbeddedApi:
    """The service this state directory runs."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = (settings.state_dir / "api").resolve()
        self.process = ManagedProcess("kappaflow service", self.home / "api.pid", (str(self.home),))

    @property
    def url(self) -> str:
        return self.settings.api.url

    @property
    def log(self) -> Path:
        return self.home / "api.log"

    def status(self) -> ApiStatus:
        proc = self.process.status()
        return ApiStatus(proc.state, proc.pid, self.url, proc.started_at)

    def argv(self) -> list[str]:
        """The service's command line; its settings travel in its environment."""
        # The home directory marks the process as this state directory's service.
        return [sys.executable, "-m", "kappaflow", "api", "serve", "--home", str(self.home)]

    def start(self, *, timeout: float = START_TIMEOUT_S) -> bool:
        """Start the service unless it runs; wait until it answers. False if it ran."""
        if self.process.status().state is ProcState.RUNNING:
            return False
        self.process.clear_stale()
        host, port = self.settings.api.host, self.settings.api.port
        check_bind(self.settings)
        if port_held(host, port):
            raise PortInUseError(
                f"port {host}:{port} is already in use: stop what holds it or choose another "
                "port (KAPPAFLOW_API__PORT)"
            )
        env = {**os.environ, SETTINGS_ENV: settings_json(self.settings)}
        self.process.spawn(self.argv(), log_file=self.log, env=env)
        pid = self.process.status().pid

        def ready() -> bool | None:
            if pid is None or self.process.exited(pid):
                last = tail(self.log, 3)
                raise ServiceExitedError(
                    "the kappaflow service exited during start-up: " + (last[-1] if last else "?")
                )
            try:
                with urllib.request.urlopen(f"{self.url}/v1/health", timeout=2) as answer:
                    return True if answer.status == 200 else None
            except (urllib.error.URLError, OSError):
                return None

        try:
            wait_for(ready, timeout=timeout, interval=0.2, what="the kappaflow service to answer")
        except TimeoutError:
            self.stop()
            raise ServiceStartTimeoutError(
                f"the kappaflow service did not answer on {self.url} within {timeout:.0f}s"
            ) from None
        return True

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> bool:
        self.process.clear_stale()
        return self.process.stop(timeout=timeout)
