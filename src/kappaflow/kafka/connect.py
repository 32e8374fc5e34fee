"""Change data capture: a Kafka Connect worker in a JVM of its own, with Debezium's
PostgreSQL connector on its plugin path.

The worker runs in distributed mode, even alone: its connectors' configurations, source
offsets and states live in topics of the configured Kafka (``<group_id>-configs``,
``-offsets``, ``-status``), so a worker restarted, here or on another machine, goes on from
the last committed position; and exactly-once source support, which only distributed mode
has, writes each batch of change records and its source offsets in one Kafka transaction.
Its configuration, log and pid file live under ``<state_dir>/connect``.

A connector (:func:`postgres_connector_config`) captures the tables it names through
PostgreSQL's ``pgoutput`` plugin with a replication slot and a publication of its own, and
writes each table's changes to the topic ``NAME.SCHEMA.TABLE`` as Debezium's JSON envelope
(``before``, ``after``, ``op``, ``ts_ms``, ``source``), keyed by the row's primary key, a
delete followed by a tombstone (a null value).
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kappaflow import rest
from kappaflow.errors import (
    ConnectRequestError,
    ConnectStartError,
    InvalidSettingError,
    KafkaUnreachableError,
    PortInUseError,
)
from kappaflow.install.artifacts import connect_plugin_path, kafka_connect_jars
from kappaflow.install.jdk import find_java
from kappaflow.kafka.clients import cluster_metadata
from kappaflow.kafka.node import rolling_log4j2, writable_dirs
from kappaflow.procs import ManagedProcess, ProcState, port_held, tail
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
CREATE_TIMEOUT_S = 120.0
#: How long a deleted connector's task may hold its replication slot before the walsender
#: holding it is ended, so the slot can be dropped.
SLOT_RELEASE_TIMEOUT_S = 30.0
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"

_LOG4J2 = rolling_log4j2(
    "connect",
    {"org.apache.kafka.clients": "WARN", "org.reflections": "ERROR", "org.eclipse.jetty": "WARN"},
)
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class ConnectWorker:
    """Start, stop and ask the Connect worker of the state directory ``settings`` name."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.config = settings.connect
        self.home = (settings.state_dir / "connect").resolve()
        self.log_dir = self.home / "logs"
        self.config_file = self.home / "worker.properties"
        self.process = ManagedProcess(
            "Kafka Connect", self.home / "connect.pid", (f"-Dkappaflow.connect.home={self.home}",)
        )

    @property
    def url(self) -> str:
        return self.config.url

    def start(self, *, timeout: float = START_TIMEOUT_S) -> bool:
        """Start the worker and wait until its REST API offers Debezium's PostgreSQL
        connector; False if it was running. Kafka must answer first."""
        if self.process.status().state is ProcState.RUNNING:
            return False
        self.process.clear_stale()
        classpath = kafka_connect_jars(self.settings)
        plugins = connect_plugin_path(self.settings)
        java = find_java()
        try:
            cluster_metadata(self.settings.kafka)
        except KafkaUnreachableError as exc:
            raise ConnectStartError(
                f"Kafka at {self.settings.kafka.bootstrap} does not answer ({exc}): the "
                "Connect worker keeps its state there; nothing was started"
            ) from None
        if port_held(self.config.host, self.config.port):
            raise PortInUseError(
                f"port {self.config.host}:{self.config.port} (connect.port) is in use"
            )
        writable_dirs(self.home, self.log_dir)
        fd = os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(worker_properties(self.settings, plugins))
        (self.home / "log4j2.properties").write_text(_LOG4J2)
        argv = [
            str(java.executable),
            f"-Xmx{self.config.heap}",
            f"-Xms{self.config.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.log_dir}",
            f"-Dkappaflow.connect.home={self.home}",
            "-cp",
            os.pathsep.join(str(jar) for jar in classpath),
            "org.apache.kafka.connect.cli.ConnectDistributed",
            str(self.config_file),
        ]
        pid = self.process.spawn(argv, log_file=self.log_dir / "connect.out")
        try:
            self._wait_ready(pid, timeout)
        except BaseException:
            self.process.stop(timeout=10)
            raise
        return True

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Stop the worker (SIGTERM: its tasks commit what they wrote), SIGKILL after
        ``timeout``; False if it was not running. Its connectors stay configured in Kafka
        and resume with the next start."""
        self.process.clear_stale()
        return self.process.stop(timeout=timeout)

    def status(self) -> dict[str, Any]:
        """Whether the worker runs, its REST URL, and each connector's and task's state."""
        proc = self.process.status()
        found: dict[str, Any] = {"state": str(proc.state), "pid": proc.pid, "url": self.url}
        if proc.state is ProcState.RUNNING:
            try:
                found["connectors"] = self.connectors()
            except ConnectRequestError as exc:
                found["error"] = str(exc)
        return found

    def logs(self, lines: int = 50) -> list[str]:
        return tail(self.log_dir / "connect.log", lines)

    def connectors(self) -> dict[str, dict[str, Any]]:
        """Each connector's state and its tasks' states."""
        expanded = self.request("GET", "/connectors?expand=status")
        return {
            name: {
                "state": body["status"]["connector"]["state"],
                "tasks": [task["state"] for task in body["status"].get("tasks", [])],
            }
            for name, body in sorted(expanded.items())
        }

    def create_postgres(
        self, name: str, dsn: str, tables: list[str], *, timeout: float = CREATE_TIMEOUT_S
    ) -> dict[str, str]:
        """Create a connector capturing ``tables`` of the PostgreSQL ``dsn`` names and wait
        until its task runs (it has then taken its snapshot's position); return its
        configuration without the password."""
        config = postgres_connector_config(name, dsn, tables)
        self.request("POST", "/connectors", {"name": name, "config": config})
        self.wait_running(name, timeout=timeout)
        return {k: v for k, v in config.items() if k != "database.password"}

    def delete(
        self, name: str, *, keep_slot: bool = False, timeout: float = SLOT_RELEASE_TIMEOUT_S
    ) -> list[str]:
        """Remove a connector, then drop its replication slot and the publication it
        created in PostgreSQL (unless ``keep_slot``): an orphaned slot holds back the
        database's log (WAL) forever. What was dropped, as ``slot NAME`` and
        ``publication NAME``."""
        config = self.request("GET", f"/connectors/{name}/config") or {}
        self.request("DELETE", f"/connectors/{name}")
        if keep_slot or config.get("connector.class") != POSTGRES_CONNECTOR:
            return []
        try:
            return drop_replication(config, timeout=timeout)
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConnectRequestError(
                f"connector {name} deleted, but its replication slot "
                f"{config.get('slot.name')!r} was not dropped ({first}): drop it with "
                f"SELECT pg_drop_replication_slot('{config.get('slot.name')}')"
            ) from None

    def wait_running(self, name: str, *, timeout: float = CREATE_TIMEOUT_S) -> None:
        """Wait until ``name`` and all its tasks run; its task's trace if one failed."""

        def running() -> bool | None:
            try:
                body = self.request("GET", f"/connectors/{name}/status")
            except ConnectRequestError:
                return None
            tasks = body.get("tasks", [])
            for task in tasks:
                if task.get("state") == "FAILED":
                    trace = str(task.get("trace", "")).strip().splitlines()
                    raise ConnectRequestError(
                        f"connector {name}'s task failed: {trace[0] if trace else 'no trace'}"
                    )
            states = [body["connector"]["state"], *(t["state"] for t in tasks)]
            return True if tasks and all(s == "RUNNING" for s in states) else None

        try:
            wait_for(running, timeout=timeout, interval=0.5, what=f"connector {name} to run")
        except TimeoutError:
            raise ConnectRequestError(
                f"connector {name} did not run within {timeout:.0f}s; see {self.log_dir}"
            ) from None

    def request(self, method: str, path: str, body: object = None) -> Any:
        """One call to the worker's REST API; its JSON answer (None when empty)."""
        try:
            raw = rest.call(self.url + path, method, body)
        except rest.RefusedError as exc:
            raise ConnectRequestError(f"Kafka Connect refused {method} {path}: {exc}") from None
        except OSError as exc:
            raise ConnectRequestError(
                f"Kafka Connect at {self.url} does not answer ({exc}): `kappaflow connect start`"
            ) from None
        return json.loads(raw) if raw else None

    def _wait_ready(self, pid: int, timeout: float) -> None:
        began = time.monotonic()

        def ready() -> bool | None:
            if self.process.exited(pid):
                errors = [ln for ln in self.logs(200) if " ERROR " in ln][-1:]
                said = errors or [ln for ln in tail(self.log_dir / "connect.out", 3) if ln]
                raise ConnectStartError(
                    "the Connect worker exited during start-up: "
                    + (" / ".join(said) if said else f"see {self.log_dir}")
                )
            try:
                plugins = self.request("GET", "/connector-plugins")
                # The herder answers only once it joined its group and read its topics.
                self.request("GET", "/connectors")
            except ConnectRequestError:
                return None
            return True if any(p.get("class") == POSTGRES_CONNECTOR for p in plugins) else None

        try:
            wait_for(ready, timeout=timeout, interval=1.0, what="the Connect worker to answer")
        except TimeoutError:
            raise ConnectStartError(
                f"the Connect worker did not answer within {time.monotonic() - began:.0f}s; "
                f"see {self.log_dir / 'connect.log'}"
            ) from None


def worker_properties(settings: Settings, plugin_path: os.PathLike[str] | str) -> str:
    """The distributed worker's configuration."""
    connect = settings.connect
    rf = str(connect.replication_factor)
    client = {k.removeprefix("kafka."): v for k, v in settings.kafka.spark_kafka_options().items()}
    props: dict[str, str] = dict(client)
    # The worker's own clients take the top-level settings; its tasks' producers and
    # consumers and its admin client take them prefixed.
    for prefix in ("producer.", "consumer.", "admin."):
        props.update({f"{prefix}{k}": v for k, v in client.items() if k != "bootstrap.servers"})
    props.update(
        {
            "group.id": connect.group_id,
            "config.storage.topic": f"{connect.group_id}-configs",
            "offset.storage.topic": f"{connect.group_id}-offsets",
            "status.storage.topic": f"{connect.group_id}-status",
            "config.storage.replication.factor": rf,
            "offset.storage.replication.factor": rf,
            "status.storage.replication.factor": rf,
            "key.converter": JSON_CONVERTER,
            "value.converter": JSON_CONVERTER,
            # Plain JSON records: the envelope alone, without Connect's schema beside it.
            "key.converter.schemas.enable": "false",
            "value.converter.schemas.enable": "false",
            # A source task's records and its source offsets in one transaction: a worker
            # killed mid-batch neither loses nor repeats a change.
            "exactly.once.source.support": "enabled",
            "offset.flush.interval.ms": "1000",
            "listeners": f"http://{connect.host}:{connect.port}",
            "rest.advertised.host.name": connect.host,
            "rest.advertised.port": str(connect.port),
            "plugin.path": str(plugin_path),
            # Kafka's and Debezium's plugins all declare themselves: no reflective scan of
            # the plugin path at start (which also trips on Debezium's optional converters).
            "plugin.discovery": "service_load",
        }
    )
    return "".join(f"{key} = {_escape(value)}\n" for key, value in props.items())


def postgres_connector_config(name: str, dsn: str, tables: list[str]) -> dict[str, str]:
    """Debezium's PostgreSQL connector for ``tables`` (``schema.table``; ``public`` when
    bare) of the database ``dsn`` names, writing to ``NAME.SCHEMA.TABLE``."""
    if not _NAME.fullmatch(name):
        raise InvalidSettingError(
            f"connector name {name!r}: letters, digits, '_', '.' and '-' only (it prefixes "
            "its topics)"
        )
    if not tables:
        raise InvalidSettingError("a connector captures at least one table: give --tables")
    try:
        parts = conninfo_to_dict(dsn)
    except Exception as exc:  # psycopg's ProgrammingError, with libpq's reason
        raise InvalidSettingError(f"not a PostgreSQL DSN: {exc}") from None
    qualified = [t if "." in t else f"public.{t}" for t in tables]
    # Slot and publication names: lowercase letters, digits and underscores.
    ident = re.sub(r"[^a-z0-9_]", "_", name.lower())
    config = {
        "connector.class": POSTGRES_CONNECTOR,
        "tasks.max": "1",
        "database.hostname": str(parts.get("host") or "127.0.0.1"),
        "database.port": str(parts.get("port") or 5432),
        "database.user": str(parts.get("user") or os.environ.get("USER", "postgres")),
        "database.dbname": str(parts.get("dbname") or parts.get("user") or "postgres"),
        "topic.prefix": name,
        "table.include.list": ",".join(re.escape(t) for t in qualified),
        # PostgreSQL's own logical decoding plugin (10 and later): nothing to install.
        "plugin.name": "pgoutput",
        "slot.name": f"kf_{ident}",
        "publication.name": f"kf_{ident}",
        # A publication of the captured tables only, created by the connector.
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": "initial",
        # Decimals as strings in the JSON (Debezium's default is base64 bytes).
        "decimal.handling.mode": "string",
        # A delete is its envelope and then a tombstone, for compaction and for tables.
        "tombstones.on.delete": "true",
        "exactly.once.support": "requested",
        # The worker creates the topics (the embedded Kafka creates none on first use):
        # one partition each, so that a table's changes keep their commit order across
        # keys too, with the cluster's replication factor.
        "topic.creation.default.partitions": "1",
        "topic.creation.default.replication.factor": "-1",
    }
    if parts.get("password"):
        config["database.password"] = str(parts["password"])
    return config


def drop_replication(config: dict[str, str], *, timeout: float) -> list[str]:
    """Drop the replication slot of a deleted PostgreSQL connector's ``config`` once its
    task has let go of it (the slot is released when the task stops; after ``timeout``
    the walsender still holding it is ended), and the publication it created."""
    conninfo = make_conninfo(
        host=config.get("database.hostname", "127.0.0.1"),
        port=config.get("database.port", "5432"),
        user=config.get("database.user"),
        dbname=config.get("database.dbname"),
        password=config.get("database.password"),
        connect_timeout="10",
    )
    slot, publication = config.get("slot.name"), config.get("publication.name")
    dropped: list[str] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        if slot:
            query = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s"

            def holder() -> int | None:
                row = conn.execute(query, (slot,)).fetchone()
                return None if row is None else int(row[0]) if row[0] is not None else 0

            def released() -> bool | None:
                return True if not holder() else None

            try:
                wait_for(released, timeout=timeout, interval=0.2, what=f"slot {slot} released")
            except TimeoutError:
                pid = holder()
                if pid:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                wait_for(released, timeout=30, interval=0.2, what=f"slot {slot} released")
            pid = holder()
            if pid is not None:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                dropped.append(f"slot {slot}")
        # Only a publication the connector created (publication.autocreate.mode).
        if publication and config.get("publication.autocreate.mode", "all_tables") != "disabled":
            found = conn.execute(
                "SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)
            ).fetchone()
            if found is not None:
                conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(publication)))
                dropped.append(f"publication {publication}")
    return dropped


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")
