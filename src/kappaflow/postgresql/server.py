"""The embedded PostgreSQL: a real server on loopback, its data under
``<state_dir>/postgres/data``, initialised on first start, with logical replication on
(``wal_level=logical``, for change data capture from it).

The binaries are the machine's: Debian's ``postgresql`` package (the newest version under
/usr/lib/postgresql), those on PATH, or ``postgres.bin_dir``. PostgreSQL refuses to run as
root, so under root the server runs as the ``postgres`` user the package creates, and its
folder is given to that user.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from kappaflow.errors import (
    PortInUseError,
    PostgresNotFoundError,
    PostgresUnreachableError,
    ServiceExitedError,
    ServiceStartTimeoutError,
    StateDirError,
)
from kappaflow.procs import ManagedProcess, ProcState, port_held, tail
from kappaflow.settings import PostgresSettings, Settings
from kappaflow.waiting import wait_for

START_TIMEOUT_S = 60.0
# A fast shutdown (SIGINT) rolls back open transactions and ends at once: a smart one
# (SIGTERM) would wait for every client, a job's tasks among them.
STOP_TIMEOUT_S = 30.0
INITDB_TIMEOUT_S = 120.0
#: Where Debian's packages put each major version's binaries.
DEBIAN_ROOT = Path("/usr/lib/postgresql")
#: The system user PostgreSQL runs as when kappaflow runs as root (Debian's package has it).
SYSTEM_USER = "postgres"
INSTALL_HINT = "sudo apt-get install postgresql"


def find_postgres_bin(configured: Path | None = None) -> Path:
    """The folder holding ``postgres`` and ``initdb``: configured, Debian's newest, or
    PATH's."""

    def complete(folder: Path) -> bool:
        return all((folder / name).is_file() for name in ("postgres", "initdb"))

    if configured is not None:
        if not complete(configured):
            raise PostgresNotFoundError(
                f"postgres.bin_dir {configured} holds no postgres and initdb"
            )
        return configured
    versions = sorted(
        (int(d.name), d / "bin")
        for d in (DEBIAN_ROOT.iterdir() if DEBIAN_ROOT.is_dir() else [])
        if d.name.isdigit()
    )
    for _, folder in reversed(versions):
        if complete(folder):
            return folder
    on_path = shutil.which("postgres")
    if on_path is not None and complete(Path(on_path).parent):
        return Path(on_path).parent
    raise PostgresNotFoundError(
        f"no PostgreSQL server found: install it ({INSTALL_HINT}) and run `make setup`, "
        "set postgres.bin_dir, or give an external server with postgres.dsn"
    )


def connect(dsn: str, *, timeout_s: int = 10) -> psycopg.Connection[tuple[object, ...]]:
    """A connection to ``dsn`` (autocommit); a clear error if the server cannot be
    reached."""
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=timeout_s)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else "no answer"
        raise PostgresUnreachableError(
            f"PostgreSQL at {redacted(dsn)} cannot be reached: {reason}"
        ) from None


def redacted(dsn: str) -> str:
    """``dsn`` without its password."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", dsn)


@dataclass(frozen=True)
class PostgresStatus:
    state: ProcState
    pid: int | None
    url: str
    started_at: float | None = None


class EmbeddedPostgres:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.config: PostgresSettings = settings.postgres
        self.home = (settings.state_dir / "postgres").resolve()
        self.data = self.home / "data"
        self.process = ManagedProcess("PostgreSQL", self.home / "postgres.pid", (str(self.data),))

    @property
    def url(self) -> str:
        """The DSN of its database (trust authentication on loopback: no password)."""
        c = self.config
        return f"postgresql://{c.user}@{c.host}:{c.port}/{c.database}"

    def status(self) -> PostgresStatus:
        proc = self.process.status()
        return PostgresStatus(proc.state, proc.pid, self.url, proc.started_at)

    def start(self, *, timeout: float = START_TIMEOUT_S) -> bool:
        """Start the server (initialising its data on first start) and wait until its
        database answers; False if it was running."""
        if self.process.status().state is ProcState.RUNNING:
            return False
        self.process.clear_stale()
        folder = find_postgres_bin(self.config.bin_dir)
        host, port = self.config.host, self.config.port
        if port_held(host, port):
            raise PortInUseError(
                f"port {host}:{port} is already in use: stop what holds it or choose another "
                "port (KAPPAFLOW_POSTGRES__PORT)"
            )
        runner = self._prepare()
        if not (self.data / "PG_VERSION").is_file():
            self._initdb(folder, runner)
        argv = [
            *runner,
            str(folder / "postgres"),
            "-D",
            str(self.data),
            "-h",
            host,
            "-p",
            str(port),
            # TCP only: a socket path under a deep state directory can pass the 107
            # characters a Unix socket's name may have.
            "-c",
            "unix_socket_directories=",
            # Logical decoding, for change data capture from the server's tables.
            "-c",
            "wal_level=logical",
            "-c",
            "max_wal_senders=10",
            "-c",
            "max_replication_slots=10",
        ]
        self.process.spawn(argv, log_file=self.home / "postgres.log")
        pid = self.process.status().pid
        admin = f"postgresql://{self.config.user}@{host}:{port}/postgres"

        def ready() -> bool | None:
            if pid is None or self.process.exited(pid):
                last = tail(self.home / "postgres.log", 3)
                raise ServiceExitedError(
                    "PostgreSQL exited during start-up: " + (last[-1] if last else "?")
                )
            try:
                with psycopg.connect(admin, autocommit=True, connect_timeout=2) as conn:
                    return True if conn.execute("SELECT 1").fetchone() else None
            except psycopg.OperationalError:
                return None

        try:
            wait_for(ready, timeout=timeout, interval=0.2, what="PostgreSQL to answer")
        except TimeoutError:
            self.stop()
            raise ServiceStartTimeoutError(
                f"PostgreSQL did not answer on {host}:{port} within {timeout:.0f}s"
            ) from None
        self._create_database(admin)
        return True

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> bool:
        self.process.clear_stale()
        return self.process.stop(timeout=timeout, sig=signal.SIGINT)

    def _prepare(self) -> list[str]:
        """The folder made (and given to the system user under root); the command prefix
        that runs a program as that user (none when not root)."""
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            (self.home / ".writable").write_text("")
        except OSError as exc:
            raise StateDirError(
                f"state directory {self.home} is not writable ({exc.strerror})"
            ) from None
        if os.geteuid() != 0:
            return []
        try:
            user = pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            raise PostgresNotFoundError(
                f"PostgreSQL refuses to run as root and there is no {SYSTEM_USER!r} user to "
                f"run it as: install the server ({INSTALL_HINT}), which creates it"
            ) from None
        _reachable(self.home, user.pw_uid, user.pw_gid)
        for path in [self.home, *self.home.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
        return [
            "setpriv",
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--init-groups",
            "--reset-env",
        ]

    def _initdb(self, folder: Path, runner: Sequence[str]) -> None:
        argv = [
            *runner,
            str(folder / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.config.user,
            # Loopback only, as the embedded Redis: no password.
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=INITDB_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            raise ServiceExitedError(
                f"initdb of {self.data} failed: {lines[-1] if lines else done.returncode}"
            )

    def _create_database(self, admin: str) -> None:
        name = self.config.database
        with connect(admin) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                conn.execute(
                    psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name))
                )


def _reachable(path: Path, uid: int, gid: int) -> None:
    """Refuse a folder the system user cannot reach: every folder above it must let it
    through."""
    for folder in path.parents:
        mode = folder.stat()
        through = (
            mode.st_mode & stat.S_IXOTH
            or (mode.st_uid == uid and mode.st_mode & stat.S_IXUSR)
            or (mode.st_gid == gid and mode.st_mode & stat.S_IXGRP)
        )
        if not through:
            raise StateDirError(
                f"PostgreSQL runs as the user {SYSTEM_USER!r} under root, and {folder} does "
                f"not let it reach {path}: choose a state directory it can reach "
                "(--state-dir or KAPPAFLOW_STATE_DIR)"
            )
