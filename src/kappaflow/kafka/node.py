"""One node of the embedded Kafka: a KRaft broker and controller in a JVM of its own.

Node 1 lives in ``<state_dir>/kafka`` (where the single-node broker always has), node N
in ``<state_dir>/kafka/node-N``: each with its data, logs, configuration and pid file.
What the node runs with is the cluster's business (:mod:`kappaflow.kafka.broker`); a node
writes the configuration it is given, formats its storage, starts and stops.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kappaflow.errors import ServiceExitedError, StateDirError
from kappaflow.procs import ManagedProcess, ProcState, tail


def writable_dirs(home: Path, *more: Path) -> None:
    """Create ``home`` and ``more``; a StateDirError with the fix if ``home`` cannot be
    written."""
    try:
        for path in (home, *more):
            path.mkdir(parents=True, exist_ok=True)
        probe = home / ".writable"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise StateDirError(
            f"state directory {home} is not writable ({exc.strerror}): "
            "choose another with --state-dir or KAPPAFLOW_STATE_DIR"
        ) from None


def rolling_log4j2(log: str, quiet: dict[str, str]) -> str:
    """A log4j2 configuration that writes ``${kafka.logs.dir}/LOG.log``, rolled at 20 MB
    (three kept), INFO by default and each logger of ``quiet`` at its level."""
    lines = [
        "status = warn",
        "appender.file.type = RollingFile",
        "appender.file.name = FILE",
        f"appender.file.fileName = ${{sys:kafka.logs.dir}}/{log}.log",
        f"appender.file.filePattern = ${{sys:kafka.logs.dir}}/{log}.log.%i",
        "appender.file.layout.type = PatternLayout",
        "appender.file.layout.pattern = [%d] %p %m (%c)%n",
        "appender.file.policies.type = Policies",
        "appender.file.policies.size.type = SizeBasedTriggeringPolicy",
        "appender.file.policies.size.size = 20MB",
        "appender.file.strategy.type = DefaultRolloverStrategy",
        "appender.file.strategy.max = 3",
        "rootLogger.level = INFO",
        "rootLogger.appenderRef.file.ref = FILE",
    ]
    for n, (logger, level) in enumerate(quiet.items()):
        lines += [f"logger.l{n}.name = {logger}", f"logger.l{n}.level = {level}"]
    return "\n".join(lines) + "\n"


_LOG4J2 = rolling_log4j2("server", {"kafka.request.logger": "WARN"})


@dataclass(frozen=True)
class BrokerStatus:
    state: ProcState
    pid: int | None
    bootstrap: str
    data_dir: Path
    started_at: float | None = None
    #: The node (None: the cluster's summary).
    node: int | None = 1


class KafkaNode:
    """Node ``index`` (1, 2, …) of the embedded Kafka whose home is ``root``."""

    def __init__(self, root: Path, index: int, host: str, ports: tuple[int, int]) -> None:
        self.index = index
        self.host = host
        self.port, self.controller_port = ports
        self.home = root if index == 1 else root / f"node-{index}"
        self.data_dir = self.home / "data"
        self.log_dir = self.home / "logs"
        self.config_file = self.home / "server.properties"
        # The trailing space ends the path: node 1's home is a prefix of the others'.
        self.marker = f"-Dkappaflow.kafka.home={self.home} "
        self.process = ManagedProcess(
            f"Kafka node {index}", self.home / "broker.pid", (self.marker,)
        )

    @property
    def address(self) -> str:
        """Where clients reach this node."""
        return f"{self.host}:{self.port}"

    @property
    def controller_address(self) -> str:
        return f"{self.host}:{self.controller_port}"

    def status(self) -> BrokerStatus:
        proc = self.process.status()
        return BrokerStatus(
            proc.state, proc.pid, self.address, self.data_dir, proc.started_at, self.index
        )

    @property
    def running(self) -> bool:
        return self.process.status().state is ProcState.RUNNING

    @property
    def formatted(self) -> bool:
        return (self.data_dir / "meta.properties").exists()

    def cluster_id(self) -> str | None:
        """The cluster id this node's storage was formatted with (None: not formatted)."""
        try:
            lines = (self.data_dir / "meta.properties").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() == "cluster.id":
                return value.strip()
        return None

    def prepare_dirs(self) -> None:
        writable_dirs(self.home, self.data_dir, self.log_dir)

    def write_config(self, props: dict[str, str]) -> None:
        # The file holds the broker's own password when secure: readable by its owner only.
        fd = os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("".join(f"{k}={v}\n" for k, v in props.items()))
        self.config_file.chmod(0o600)
        (self.home / "log4j2.properties").write_text(_LOG4J2)

    def jvm(
        self, java: Path, heap: str, classpath: list[Path], options: Sequence[str] = ()
    ) -> list[str]:
        """The JVM's command line up to its main class; ``options`` after kappaflow's."""
        return [
            str(java),
            f"-Xmx{heap}",
            f"-Xms{heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.log_dir}",
            *options,
            self.marker.strip(),
            "-cp",
            os.pathsep.join(str(jar) for jar in classpath),
        ]

    def format(self, jvm: list[str], cluster_id: str, extra: list[str]) -> None:
        """Format this node's storage as a node of ``cluster_id`` (nothing if it is)."""
        result = subprocess.run(
            [
                *jvm,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                cluster_id,
                "-c",
                str(self.config_file),
                "--ignore-formatted",
                *extra,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            reason = (result.stderr or result.stdout).strip().splitlines()
            raise ServiceExitedError(
                f"formatting the storage of Kafka node {self.index} failed: "
                f"{reason[-1] if reason else '?'}"
            )

    def spawn(self, jvm: list[str]) -> int:
        """Start the node; it answers some seconds later."""
        self.process.clear_stale()
        return self.process.spawn(
            [*jvm, "kafka.Kafka", str(self.config_file)], log_file=self.log_dir / "broker.out"
        )

    def exit_reason(self) -> str:
        """The last line the node wrote before it exited."""
        last = tail(self.log_dir / "broker.out", 5) or self.logs(5)
        return last[-1] if last else f"see {self.log_dir}"

    def stop(self, *, timeout: float) -> bool:
        """Controlled shutdown, then SIGKILL after ``timeout``; False if it was not running."""
        self.process.clear_stale()
        return self.process.stop(timeout=timeout)

    def logs(self, lines: int = 50) -> list[str]:
        return tail(self.log_dir / "server.log", lines)
