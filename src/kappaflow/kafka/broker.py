"""The embedded Kafka: one KRaft node, or a cluster of ``kafka.brokers`` nodes on this
machine, each a broker and a controller in a JVM of its own (:mod:`kappaflow.kafka.node`).

The nodes' storage is formatted on first start, with one cluster id; how many nodes it
was made with is kept in ``<state_dir>/kafka/brokers``, and a later start with another
number is refused. One node is a dynamic quorum of itself (``--standalone``); several are
a static quorum of them all (``controller.quorum.voters``), whose addresses come from the
settings at every start. Replication follows the node count: with three or more, every
topic kappaflow makes has three replicas and a write with ``acks=all`` needs two of them.
Stopping sends SIGTERM (Kafka's shutdown hook does a controlled shutdown) and kills after
a timeout; a restart keeps every topic and record.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import secrets
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kappaflow.errors import (
    BrokerCountError,
    PortInUseError,
    SecurityMaterialError,
    SecurityModeError,
    ServiceExitedError,
    ServiceStartTimeoutError,
)
from kappaflow.install.artifacts import kafka_broker_jars
from kappaflow.install.jdk import find_java
from kappaflow.kafka.node import BrokerStatus, KafkaNode
from kappaflow.procs import ManagedProcess, ProcState, port_held
from kappaflow.security import (
    ADMIN_USER,
    BROKER_CN,
    BROKER_USER,
    SCRAM_ITERATIONS,
    SecurityHome,
)
from kappaflow.settings import Settings, brokers_marker, secure_marker
from kappaflow.waiting import wait_for

START_TIMEOUT_S = 90.0
#: More start-up time for each further node of a cluster: its JVMs share the machine's
#: CPU, and a node restarted after a crash first recovers its logs (on two busy cores a
#: killed node's restart took 80 s).
NODE_START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
#: How long the nodes of a cluster still stopping once most have stopped get before they
#: are killed (:meth:`EmbeddedBroker._stop`): a node's controlled shutdown, once approved,
#: closes its logs in a few seconds.
QUORUM_GONE_GRACE_S = 10.0

# A cluster's failure detection, faster than Kafka's defaults (2 s heartbeats, a 9 s
# session, 30 s of lag) so that a local cluster fails over in seconds: a broker that
# misses heartbeats for 6 s is fenced and its partitions led by others; a follower that
# has not caught up for 10 s leaves the ISR. Not shorter: a broker's GC pause on a busy
# two-core machine must not fence it.
_FAILURE_DETECTION = {
    "broker.heartbeat.interval.ms": "1000",
    "broker.session.timeout.ms": "6000",
    "replica.lag.time.max.ms": "10000",
}
# A cluster's consumer offsets and transaction state in 10 partitions each, not Kafka's
# 50: one machine gains nothing from 50 coordinators, and each partition is a log every
# node loads when it starts (a killed node's restart spent 13 s loading 118 of them) and
# a replica it keeps fetching.
_INTERNAL_PARTITIONS = {
    "offsets.topic.num.partitions": "10",
    "transaction.state.log.num.partitions": "10",
}


def replication(nodes: int) -> tuple[int, int]:
    """The replication factor and ``min.insync.replicas`` of a cluster of ``nodes``: three
    replicas (or as many as there are nodes) of which all but one must have a write."""
    factor = min(nodes, 3)
    return factor, max(1, factor - 1)


class EmbeddedBroker:
    """Start, stop and inspect the embedded Kafka described by ``settings``: its nodes
    together (``nodes[0]`` is node 1)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        kafka = settings.kafka
        self.home = (settings.state_dir / "kafka").resolve()
        self.nodes = [
            KafkaNode(self.home, n, kafka.host, kafka.node_ports(n))
            for n in range(1, kafka.nodes + 1)
        ]

    @property
    def bootstrap(self) -> str:
        return self.settings.kafka.bootstrap

    @property
    def data_dir(self) -> Path:
        """Node 1's log directory."""
        return self.nodes[0].data_dir

    @property
    def process(self) -> ManagedProcess:
        """Node 1's process (the only one of a single broker)."""
        return self.nodes[0].process

    def status(self) -> BrokerStatus:
        """The single node's status; a cluster's is running where every node runs, else
        the state and pid of the first node that does not (:meth:`statuses` has each)."""
        found = self.statuses()
        if len(found) == 1:
            return found[0]
        down = [s for s in found if s.state is not ProcState.RUNNING]
        first = (down or found)[0]
        return BrokerStatus(
            first.state, first.pid, self.bootstrap, self.home, found[0].started_at, None
        )

    def statuses(self) -> list[BrokerStatus]:
        """Every node's status, node 1 first."""
        return [node.status() for node in self.nodes]

    @property
    def secure(self) -> bool:
        """Whether this broker starts (or runs) with security on."""
        return self.settings.secure

    def start(self, *, timeout: float | None = None) -> bool:
        """Start the nodes that do not run and wait until they answer; False if every
        node was running already."""
        return bool(self.start_nodes(timeout=timeout))

    def start_nodes(self, *, timeout: float | None = None) -> list[int]:
        """Start the nodes that do not run, wait until they answer (``timeout``, by default
        START_TIMEOUT_S and NODE_START_TIMEOUT_S for each node after the first); the nodes
        started.

        With security on, the first start makes the state directory's authority, the
        broker's certificate and the passwords, and gives the nodes' storage the admin's
        and the broker's SCRAM credentials; storage made without them is started once
        without security to be given them."""
        self._check_node_count()
        if timeout is None:
            timeout = START_TIMEOUT_S + NODE_START_TIMEOUT_S * (len(self.nodes) - 1)
        running = [node for node in self.nodes if node.running]
        if running:
            running_secure = secure_marker(self.settings.state_dir).exists()
            if self.secure != running_secure:
                now, asked = ("on", "off") if running_secure else ("off", "on")
                raise SecurityModeError(
                    f"the Kafka broker runs with security {now}: stop it (`kappaflow kafka "
                    f"stop`) before starting it with security {asked}"
                )
        pending = [node for node in self.nodes if node not in running]
        if not pending:
            return []
        self._check_ports(pending)
        for node in self.nodes:
            node.prepare_dirs()
        brokers_marker(self.settings.state_dir).write_text(f"{len(self.nodes)}\n")
        jvms = self._jvms()
        if self.secure:
            self._prepare_security(jvms, timeout, pending)
        else:
            secure_marker(self.settings.state_dir).unlink(missing_ok=True)
        self._write_configs(secure=self.secure)
        self._format(jvms)
        self._launch(jvms, pending, secure=self.secure, timeout=timeout)
        return [node.index for node in pending]

    def _check_node_count(self) -> None:
        """Refuse a start with another number of nodes than the storage was made with,
        before anything is written."""
        marker = brokers_marker(self.settings.state_dir)
        try:
            made = int(marker.read_text())
        except FileNotFoundError:
            # Storage of a kappaflow from before clusters: node 1's alone.
            made = 1 if self.nodes[0].formatted else len(self.nodes)
        except (OSError, ValueError):
            made = len(self.nodes)
        if made != len(self.nodes):
            asked = len(self.nodes)
            raise BrokerCountError(
                f"the embedded Kafka in {self.home} was made with {made} node"
                f"{'s' if made > 1 else ''}: start it with `--brokers {made}` (or unset "
                f"kafka.brokers), or stop it and move {self.home} away for a new one of "
                f"{asked} (its topics stay behind)"
            )

    def _check_ports(self, nodes: list[KafkaNode]) -> None:
        """Each node's ports are free, or come free within the grace of ``port_held``."""
        host = self.settings.kafka.host
        for node in nodes:
            for port in (node.port, node.controller_port):
                if port_held(host, port):
                    raise PortInUseError(
                        f"port {host}:{port} of Kafka node {node.index} is already in use: "
                        "stop what holds it or choose other ports (KAPPAFLOW_KAFKA__PORT, "
                        "KAPPAFLOW_KAFKA__CONTROLLER_PORT; node N uses both plus 10*(N-1))"
                    )

    def _jvms(self) -> dict[int, list[str]]:
        """Each node's JVM command line up to the main class, by node."""
        java = find_java()
        classpath = kafka_broker_jars(self.settings)
        kafka = self.settings.kafka
        return {
            node.index: node.jvm(java.executable, kafka.heap, classpath, kafka.jvm_options)
            for node in self.nodes
        }

    def _launch(
        self, jvms: dict[int, list[str]], nodes: list[KafkaNode], *, secure: bool, timeout: float
    ) -> None:
        """Start ``nodes`` together (a quorum of several needs most of them up before any
        answers) and wait until each answers; on failure stop those it started."""
        for node in nodes:
            node.spawn(jvms[node.index])
        try:
            self._wait_ready(nodes, timeout, secure=secure)
        except BaseException:
            self._stop(nodes, timeout=5)
            raise

    def _prepare_security(
        self, jvms: dict[int, list[str]], timeout: float, pending: list[KafkaNode]
    ) -> None:
        """The certificates, and the SCRAM credentials in the nodes' storage: at format
        time for new storage, else through one start without security."""
        kafka = self.settings.kafka
        made = self.security.secrets()
        self.security.ensure_tls((kafka.host,))
        credentials = self.home / "scram.credentials"
        fingerprint = made.fingerprint()
        formatted = self.nodes[0].formatted
        if formatted and credentials.exists():
            if credentials.read_text().strip() != fingerprint:
                raise SecurityMaterialError(
                    f"{self.security.secrets_file} is not the one this broker's credentials "
                    f"were made from: restore it, or give the broker new storage ({self.home})"
                )
        elif formatted:
            self._write_configs(secure=False)
            self._format(jvms)
            self._launch(jvms, pending, secure=False, timeout=timeout)
            try:
                from kappaflow.kafka.access import upsert_users

                plain = kafka.model_copy(
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
                self._stop(pending, timeout=STOP_TIMEOUT_S)
            credentials.write_text(fingerprint + "\n")
        secure_marker(self.settings.state_dir).write_text("")

    @property
    def security(self) -> SecurityHome:
        return SecurityHome(self.settings.state_dir)

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Controlled shutdown of every node, then SIGKILL after ``timeout``; False if
        none was running."""
        return bool(self._stop(self.nodes, timeout=timeout))

    def stop_nodes(self, *, timeout: float = STOP_TIMEOUT_S) -> list[int]:
        """Stop every node as :meth:`stop` does; the nodes that were running."""
        return self._stop(self.nodes, timeout=timeout)

    def _stop(self, nodes: list[KafkaNode], *, timeout: float) -> list[int]:
        """SIGTERM to ``nodes`` together, SIGKILL to each after ``timeout``; the nodes that
        were running.

        A node's controlled shutdown waits for the controllers to approve it, which takes
        a majority of them: once fewer than that run, the nodes still stopping wait for
        an approval that cannot come (for five minutes, Kafka's bound). They get
        QUORUM_GONE_GRACE_S to finish what they were doing, then SIGKILL, as Kafka's own
        system tests do; they lose nothing acknowledged (the page cache keeps what they
        wrote) but recover their logs at the next start."""
        if len(nodes) == 1 and len(self.nodes) == 1:
            return [nodes[0].index] if nodes[0].stop(timeout=timeout) else []
        majority = len(self.nodes) // 2 + 1
        with ThreadPoolExecutor(len(nodes)) as pool:
            stopping = [pool.submit(node.stop, timeout=timeout) for node in nodes]

            def quorum_gone() -> bool | None:
                if all(f.done() for f in stopping):
                    return True
                running = [node for node in self.nodes if node.running]
                return True if len(running) < majority else None

            with contextlib.suppress(TimeoutError):
                wait_for(quorum_gone, timeout=timeout, interval=0.2, what="the nodes to stop")
            if not all(f.done() for f in stopping):
                with contextlib.suppress(TimeoutError):
                    wait_for(
                        lambda: True if all(f.done() for f in stopping) else None,
                        timeout=QUORUM_GONE_GRACE_S,
                        what="the nodes to stop",
                    )
                for node in nodes:
                    pid = node.process.status().pid
                    if pid is not None and node.running:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
            stopped = [f.result() for f in stopping]
        return [node.index for node, was in zip(nodes, stopped, strict=True) if was]

    def _name(self, node: KafkaNode) -> str:
        return "Kafka broker" if len(self.nodes) == 1 else f"Kafka node {node.index}"

    def logs(self, lines: int = 50, node: int = 1) -> list[str]:
        return self.nodes[node - 1].logs(lines)

    def _write_configs(self, *, secure: bool) -> None:
        for node in self.nodes:
            node.write_config(self._props(node, secure=secure))

    def _props(self, node: KafkaNode, *, secure: bool) -> dict[str, str]:
        client = "SASL_SSL" if secure else "PLAINTEXT"
        factor, min_isr = replication(len(self.nodes))
        listeners = f"{client}://{node.address},CONTROLLER://{node.controller_address}"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.index),
            "listeners": listeners,
            "advertised.listeners": listeners,
            "listener.security.protocol.map": f"CONTROLLER:{'SSL' if secure else 'PLAINTEXT'},"
            f"{client}:{client}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": client,
            "log.dirs": str(node.data_dir),
            "num.partitions": "1",
            "default.replication.factor": str(factor),
            "min.insync.replicas": str(min_isr),
            "offsets.topic.replication.factor": str(factor),
            "transaction.state.log.replication.factor": str(factor),
            "transaction.state.log.min.isr": str(min_isr),
            "share.coordinator.state.topic.replication.factor": str(factor),
            "share.coordinator.state.topic.min.isr": str(min_isr),
            # A local platform: nobody else joins a group late, so waiting only adds latency.
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.retention.hours": "168",
        }
        if len(self.nodes) == 1:
            props["controller.quorum.bootstrap.servers"] = node.controller_address
        else:
            props["controller.quorum.voters"] = ",".join(
                f"{other.index}@{other.controller_address}" for other in self.nodes
            )
            # Only a replica that has every acknowledged write may lead (Kafka's default,
            # said here because the tests of acks=all depend on it).
            props["unclean.leader.election.enable"] = "false"
            props.update(_FAILURE_DETECTION)
            props.update(_INTERNAL_PARTITIONS)
        if secure:
            props.update(self._security_props())
        return props

    def _security_props(self) -> dict[str, str]:
        """Clients and brokers: SASL/SCRAM-SHA-512 over TLS. The controllers: TLS with the
        broker's certificate on both ends (SCRAM cannot serve a controller, whose
        credentials live in the metadata it serves). Access: Kafka's ACLs, nothing allowed
        by default."""
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
            # The brokers (their SCRAM user, and their certificate's subject at the
            # controllers) and kappaflow's admin may do anything; everyone else what ACLs
            # allow.
            "super.users": f"User:{BROKER_USER};User:CN={BROKER_CN};User:{ADMIN_USER}",
        }

    def _format(self, jvms: dict[int, list[str]]) -> None:
        """Format the nodes not formatted yet as nodes of the cluster the others were
        formatted for (a new one where none was)."""
        nodes = [node for node in self.nodes if not node.formatted]
        if not nodes:
            return
        known = [cid for node in self.nodes if (cid := node.cluster_id()) is not None]
        cluster_id = known[0] if known else _cluster_id()
        extra: list[str] = []
        if len(self.nodes) == 1:
            extra.append("--standalone")
        if self.secure:
            made = self.security.secrets()
            for user, password in (
                (BROKER_USER, made.broker_password),
                (ADMIN_USER, made.admin_password),
            ):
                extra += ["--add-scram", _scram_entry(user, password)]
        for node in nodes:
            node.format(jvms[node.index], cluster_id, extra)
        (self.home / "cluster.id").write_text(cluster_id + "\n")
        if self.secure:
            (self.home / "scram.credentials").write_text(
                self.security.secrets().fingerprint() + "\n"
            )

    def _wait_ready(self, nodes: list[KafkaNode], timeout: float, *, secure: bool) -> None:
        """Wait until each of ``nodes`` answers metadata as a broker of the cluster."""
        from confluent_kafka.admin import AdminClient

        config = self.settings.kafka.client_config() if secure else {}
        clients = {
            node.index: AdminClient({**config, "bootstrap.servers": node.address, "log_level": "0"})
            for node in nodes
        }
        pids = {node.index: node.process.status().pid for node in nodes}
        waiting = set(clients)

        def ready() -> bool | None:
            for node in nodes:
                pid = pids[node.index]
                if pid is None or node.process.exited(pid):
                    raise ServiceExitedError(
                        f"{self._name(node)} exited during start-up: {node.exit_reason()}"
                    )
            for index in sorted(waiting):
                try:
                    metadata = clients[index].list_topics(timeout=1.0)
                except Exception:
                    continue
                if index in metadata.brokers:
                    waiting.discard(index)
            return True if not waiting else None

        try:
            wait_for(ready, timeout=timeout, interval=0.3, what="the Kafka nodes to answer")
        except TimeoutError:
            late = self.nodes[min(waiting) - 1]
            raise ServiceStartTimeoutError(
                f"{self._name(late)} did not answer on {late.address} within {timeout:.0f}s; "
                f"see {late.log_dir / 'server.log'}"
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
