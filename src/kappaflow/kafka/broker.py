"""The embedded Kafka broker: one KRaft node (broker + controller) in a JVM of its own.

Its storage is formatted on first start; data, logs, configuration and the pid file live
under ``<state_dir>/kafka``. Stopping sends SIGTERM (Kafka's shutdown hook does a
controlled shutdown) and kills after a timeout; a restart keeps every topic and record.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from kappaflow.errors import (
    PortInUseError,
    SecurityMaterialError,
    SecurityModeError,
    ServiceExitedError,
    ServiceStartTimeoutError,
    StateDirError,
)
from kappaflow.install.artifacts import kafka_broker_jars
from kappaflow.install.java import find_java
from kappaflow.procs import ManagedProcess, ProcState, port_in_use, tail
from kappaflow.security import (
    ADMIN_USER,
    BROKER_CN,
    BROKER_USER,
    SCRAM_ITERATIONS,
    SecurityHome,
)
from kappaflow.settings import Settings, secure_marker
from kappaflow.waiting import wait_for

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0

_LOG4J2 = """\
status = warn
appender.file.type = RollingFile
appender.file.name = SERVER
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = SERVER
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


@dataclass(frozen=True)
class BrokerStatus:
    state: ProcState
    pid: int | None
    bootstrap: str
    data_dir: Path
    started_at: float | None = None


class EmbeddedBroker:
    """Start, stop and inspect the single-node broker described by ``settings``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = (settings.state_dir / "kafka").resolve()
        self.data_dir = self.home / "data"
        self.log_dir = self.home / "logs"
        self.config_file = self.home / "server.properties"
        self.process = ManagedProcess(
            "Kafka broker", self.home / "broker.pid", (f"-Dkappaflow.kafka.home={self.home}",)
        )

    @property
    def bootstrap(self) -> str:
        return f"{self.settings.kafka.host}:{self.settings.kafka.port}"

    def status(self) -> BrokerStatus:
        proc = self.process.status()
        return BrokerStatus(proc.state, proc.pid, self.bootstrap, self.data_dir, proc.started_at)

    @property
    def secure(self) -> bool:
        """Whether this broker starts (or runs) with security on."""
        return self.settings.secure

    def start(self, *, timeout: float = START_TIMEOUT_S) -> bool:
        """Start the broker and wait until it answers; False if it was already running.

        With security on, the first start makes the state directory's authority, the
        broker's certificate and the passwords, and gives the broker's storage the admin's
        and the broker's SCRAM credentials; a broker whose storage was made without them
        is started once without security to be given them."""
        if self.process.status().state is ProcState.RUNNING:
            running_secure = secure_marker(self.settings.state_dir).exists()
            if self.secure != running_secure:
                now, asked = ("on", "off") if running_secure else ("off", "on")
                raise SecurityModeError(
                    f"the Kafka broker runs with security {now}: stop it (`kappaflow kafka "
                    f"stop`) before starting it with security {asked}"
                )
            return False
        self.process.clear_stale()
        kafka = self.settings.kafka
        for port in (kafka.port, kafka.controller_port):
            if port_in_use(kafka.host, port):
                raise PortInUseError(
                    f"port {kafka.host}:{port} is already in use: stop what holds it or choose "
                    "other ports (KAPPAFLOW_KAFKA__PORT, KAPPAFLOW_KAFKA__CONTROLLER_PORT)"
                )
        self._prepare_dirs()
        jvm = self._jvm()
        if self.secure:
            self._prepare_security(jvm, timeout)
        else:
            secure_marker(self.settings.state_dir).unlink(missing_ok=True)
        self._write_config(secure=self.secure)
        if not (self.data_dir / "meta.properties").exists():
            self._format(jvm)
        self._launch(jvm, secure=self.secure, timeout=timeout)
        return True

    def _jvm(self) -> list[str]:
        java = find_java()
        classpath = kafka_broker_jars(self.settings)
        kafka = self.settings.kafka
        return [
            str(java.executable),
            f"-Xmx{kafka.heap}",
            f"-Xms{kafka.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.log_dir}",
            f"-Dkappaflow.kafka.home={self.home}",
            "-cp",
            os.pathsep.join(str(jar) for jar in classpath),
        ]

    def _launch(self, jvm: list[str], *, secure: bool, timeout: float) -> None:
        self.process.spawn(
            [*jvm, "kafka.Kafka", str(self.config_file)], log_file=self.log_dir / "broker.out"
        )
        self._wait_ready(timeout, secure=secure)

    def _prepare_security(self, jvm: list[str], timeout: float) -> None:
        """The certificates, and the SCRAM credentials in the broker's storage: at format
        time for new storage, else through one start without security."""
        kafka = self.settings.kafka
        made = self.security.secrets()
        self.security.ensure_tls((kafka.host,))
        credentials = self.home / "scram.credentials"
        fingerprint = made.fingerprint()
        formatted = (self.data_dir / "meta.properties").exists()
        if formatted and credentials.exists():
            if credentials.read_text().strip() != fingerprint:
                raise SecurityMaterialError(
                    f"{self.security.secrets_file} is not the one this broker's credentials "
                    f"were made from: restore it, or give the broker new storage ({self.data_dir})"
                )
        elif formatted:
            self._write_config(secure=False)
            self._launch(jvm, secure=False, timeout=timeout)
            try:
                from kappaflow.kafka.access import upsert_users

                plain = self.settings.kafka.model_copy(
                    update={
                        "security_protocol": "PLAINTEXT",
                        "sasl_mechanism": None,
                        "ssl_ca_location": None,
                    }
                )
                upsert_users(
                    plain,
                    {ADMIN_USER: made.admin_password, BROKER_USER: made.broker_password},
                )
            finally:
                self.process.stop(timeout=STOP_TIMEOUT_S)
            credentials.write_text(fingerprint + "\n")
        secure_marker(self.settings.state_dir).write_text("")

    @property
    def security(self) -> SecurityHome:
        return SecurityHome(self.settings.state_dir)

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Controlled shutdown, then SIGKILL after ``timeout``; False if it was not running."""
        self.process.clear_stale()
        return self.process.stop(timeout=timeout)

    def logs(self, lines: int = 50) -> list[str]:
        return tail(self.log_dir / "server.log", lines)

    def _prepare_dirs(self) -> None:
        try:
            for path in (self.home, self.data_dir, self.log_dir):
                path.mkdir(parents=True, exist_ok=True)
            probe = self.home / ".writable"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise StateDirError(
                f"state directory {self.home} is not writable ({exc.strerror}): "
                "choose another with --state-dir or KAPPAFLOW_STATE_DIR"
            ) from None

    def _write_config(self, *, secure: bool) -> None:
        kafka = self.settings.kafka
        host = kafka.host
        client = "SASL_SSL" if secure else "PLAINTEXT"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{host}:{kafka.controller_port}",
            "listeners": f"{client}://{host}:{kafka.port},CONTROLLER://{host}:{kafka.controller_port}",
            "advertised.listeners": f"{client}://{host}:{kafka.port},"
            f"CONTROLLER://{host}:{kafka.controller_port}",
            "listener.security.protocol.map": f"CONTROLLER:{'SSL' if secure else 'PLAINTEXT'},"
            f"{client}:{client}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": client,
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # One node: nobody else can join a group, so waiting for them only adds latency.
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.retention.hours": "168",
        }
        if secure:
            props.update(self._security_props())
        # The file holds the broker's own password when secure: readable by its owner only.
        fd = os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("".join(f"{k}={v}\n" for k, v in props.items()))
        self.config_file.chmod(0o600)
        (self.home / "log4j2.properties").write_text(_LOG4J2)

    def _security_props(self) -> dict[str, str]:
        """Clients: SASL/SCRAM-SHA-512 over TLS. The controller: TLS with the broker's
        certificate on both ends (SCRAM cannot serve a controller, whose credentials live in
        the metadata it serves). Access: Kafka's ACLs, nothing allowed by default."""
        tls = self.security
        made = tls.secrets()
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{BROKER_USER}" password="{made.broker_password}";'
        )
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(tls.broker_pem),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tls.ca_cert),
            "ssl.endpoint.identification.algorithm": "https",
            "listener.name.controller.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            # The broker (its SCRAM user, and its certificate's subject at the controller)
            # and kappaflow's admin may do anything; everyone else what ACLs allow.
            "super.users": f"User:{BROKER_USER};User:CN={BROKER_CN};User:{ADMIN_USER}",
        }

    def _format(self, jvm: list[str]) -> None:
        cluster_id = _cluster_id()
        scram: list[str] = []
        if self.secure:
            made = self.security.secrets()
            for user, password in (
                (BROKER_USER, made.broker_password),
                (ADMIN_USER, made.admin_password),
            ):
                scram += ["--add-scram", _scram_entry(user, password)]
        result = subprocess.run(
            [
                *jvm,
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                "-t",
                cluster_id,
                "-c",
                str(self.config_file),
                "--ignore-formatted",
                *scram,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            reason = (result.stderr or result.stdout).strip().splitlines()
            raise ServiceExitedError(
                f"formatting Kafka storage failed: {reason[-1] if reason else '?'}"
            )
        (self.home / "cluster.id").write_text(cluster_id + "\n")
        if self.secure:
            (self.home / "scram.credentials").write_text(
                self.security.secrets().fingerprint() + "\n"
            )

    def _wait_ready(self, timeout: float, *, secure: bool) -> None:
        from confluent_kafka.admin import AdminClient

        config = (
            self.settings.kafka.client_config() if secure else {"bootstrap.servers": self.bootstrap}
        )
        admin = AdminClient({**config, "log_level": "0"})
        pid = self.process.status().pid

        def ready() -> bool | None:
            if pid is None or self.process.exited(pid):
                last = tail(self.log_dir / "broker.out", 5) or self.logs(5)
                raise ServiceExitedError(
                    "Kafka broker exited during start-up: "
                    + (last[-1] if last else f"see {self.log_dir}")
                )
            try:
                metadata = admin.list_topics(timeout=1.0)
            except Exception:
                return None
            return True if metadata.brokers else None

        try:
            wait_for(ready, timeout=timeout, interval=0.3, what="the Kafka broker to answer")
        except TimeoutError:
            self.stop(timeout=5)
            raise ServiceStartTimeoutError(
                f"Kafka broker did not answer on {self.bootstrap} within {timeout:.0f}s; "
                f"see {self.log_dir / 'server.log'}"
            ) from None


def _scram_entry(user: str, password: str) -> str:
    """StorageTool's ``--add-scram`` value for ``user``: the salted password (RFC 5802's
    Hi, PBKDF2 with HMAC-SHA-512), so the password itself is never on a command line."""
    salt = secrets.token_bytes(24)
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, SCRAM_ITERATIONS)
    b64 = base64.b64encode
    return (
        f"SCRAM-SHA-512=[name={user},iterations={SCRAM_ITERATIONS},"
        f'salt="{b64(salt).decode()}",saltedpassword="{b64(salted).decode()}"]'
    )


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, not '-'-led."""
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not value.startswith("-"):
            return value
