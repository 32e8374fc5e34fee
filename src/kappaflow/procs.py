"""Background processes that outlive the command that started them.

Each managed process has a pid file and a marker: a string that must appear in its
command line. A pid file whose process is gone, or whose pid now belongs to some other
program, is stale and is reported and cleared rather than trusted.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from kappaflow.errors import ProcessStopError, WaitTimeoutError
from kappaflow.waiting import wait_for


class ProcState(enum.StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    STALE = "stale"


@dataclass(frozen=True)
class ProcStatus:
    state: ProcState
    pid: int | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class ManagedProcess:
    """A detached process identified by a pid file and command-line markers.

    The process counts as ours when any marker appears in its command line (several,
    because some programs, such as redis-server, rewrite their title after start-up).
    """

    name: str
    pid_file: Path
    markers: tuple[str, ...]

    def status(self) -> ProcStatus:
        pid = self._read_pid()
        if pid is None:
            return ProcStatus(ProcState.STOPPED)
        proc = self._find(pid)
        if proc is None:
            return ProcStatus(ProcState.STALE, pid)
        return ProcStatus(ProcState.RUNNING, pid, proc.create_time())

    def clear_stale(self) -> int | None:
        """Remove a stale pid file; return the pid it named, if it was stale."""
        status = self.status()
        if status.state is ProcState.STALE:
            self.pid_file.unlink(missing_ok=True)
            return status.pid
        return None

    def spawn(
        self,
        argv: Sequence[str],
        *,
        log_file: Path,
        env: Mapping[str, str] | None = None,
    ) -> int:
        """Start ``argv`` in a new session, output appended to ``log_file``; record its pid.

        The process outlives the call and is found again by its pid file, so no Popen
        object keeps track of it (one would warn, when collected, that its process still
        runs). A session of its own: Ctrl-C in the starting terminal must not reach it.
        """
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log_file), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        pid = os.posix_spawnp(
            argv[0],
            list(argv),
            dict(os.environ if env is None else env),
            file_actions=actions,
            setsid=True,
        )
        self.pid_file.write_text(f"{pid}\n")
        return pid

    @staticmethod
    def exited(pid: int) -> bool:
        """True once the process ``pid`` is gone (or a zombie).

        For a process just spawned, whose pid cannot have been reused yet. Markers are not
        checked: a program rewriting its title (redis-server does) can be read mid-rewrite.
        """
        return not ManagedProcess._exists(pid)

    def stop(self, *, timeout: float, sig: signal.Signals = signal.SIGTERM) -> bool:
        """Ask the process to stop, kill it after ``timeout``; True if it was running."""
        status = self.status()
        if status.state is not ProcState.RUNNING or status.pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        pid = status.pid
        try:
            os.kill(pid, sig)
            wait_for(
                lambda: True if self.exited(pid) else None,
                timeout=timeout,
                what=f"{self.name} to stop",
            )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            try:
                wait_for(
                    lambda: True if self.exited(pid) else None,
                    timeout=10,
                    what=f"{self.name} to die",
                )
            except TimeoutError:
                raise ProcessStopError(f"{self.name} (pid {pid}) survived SIGKILL") from None
        except ProcessLookupError:
            pass
        self.pid_file.unlink(missing_ok=True)
        return True

    def _read_pid(self) -> int | None:
        try:
            text = self.pid_file.read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return int(text) if text.isdigit() else -1

    def _find(self, pid: int) -> psutil.Process | None:
        if pid <= 0:
            return None
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            for attempt in range(2):
                cmdline = " ".join(proc.cmdline())
                if any(marker in cmdline for marker in self.markers):
                    return proc
                if attempt == 0:
                    # A title being rewritten can read as neither old nor new: look again.
                    time.sleep(0.05)
            return None
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    @staticmethod
    def _exists(pid: int) -> bool:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                # Reap it if it is our child; otherwise its parent will.
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                return False
            return True
        except psutil.NoSuchProcess:
            return False


def port_in_use(host: str, port: int) -> bool:
    """True if ``host:port`` cannot be bound, as the service about to start would."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


#: How long a service's start waits for its port to come free before refusing it.
PORT_GRACE_S = 5.0


def port_held(host: str, port: int, grace: float = PORT_GRACE_S) -> bool:
    """True if ``host:port`` is still in use after ``grace`` seconds. A port in the range
    the system hands out can be held for a moment by a connection it was given to once the
    service that listened on it was killed; a restart waits that moment out."""
    try:
        wait_for(
            lambda: None if port_in_use(host, port) else True,
            timeout=grace,
            interval=0.2,
            what=f"port {host}:{port} to be free",
        )
    except WaitTimeoutError:
        return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the system's pick)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of a text file (empty if it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            data = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return data.splitlines()[-lines:]
