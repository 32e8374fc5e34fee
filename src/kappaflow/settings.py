"""One typed, immutable settings object for the whole platform.

Sources, highest precedence first: explicit overrides (CLI flags), ``KAPPAFLOW_*``
environment variables (nested with ``__``: ``KAPPAFLOW_KAFKA__BOOTSTRAP_SERVERS``),
the TOML file (``--config``, ``$KAPPAFLOW_CONFIG`` or ``./kappaflow.toml``), defaults.
Kafka client and Spark options are derived here and nowhere else.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from kappaflow.errors import ConfigFileNotFoundError, ConfigSyntaxError, InvalidSettingError

DEFAULT_CONFIG_FILE = Path("kappaflow.toml")

_config_file: ContextVar[Path | None] = ContextVar("kappaflow_config_file", default=None)

_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


#: The ports of the embedded Kafka's node N are those of node 1 plus NODE_PORT_STEP*(N-1):
#: 9092/9093, 9102/9103, 9112/9113 with the defaults, so one number names every port.
NODE_PORT_STEP = 10
#: At most this many embedded nodes: each is a JVM with a heap of its own, and a local
#: cluster is for trying replication and failover, for which three do.
MAX_NODES = 9


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(_Section):
    """Where the event log lives, and how clients reach it."""

    bootstrap_servers: str | None = Field(
        default=None,
        description="host:port[,host:port] of an external cluster; unset means the embedded broker",
    )
    host: str = Field(default="127.0.0.1", description="address the embedded broker listens on")
    port: int = Field(default=9092, ge=1, le=65535, description="embedded broker's client port")
    controller_port: int = Field(
        default=9093, ge=1, le=65535, description="embedded broker's KRaft controller port"
    )
    heap: str = Field(default="512m", description="embedded broker's JVM heap (-Xmx)")
    jvm_options: list[str] = Field(
        default_factory=list,
        description="further options of the embedded broker's JVMs, after kappaflow's (a "
        "later -XX wins)",
    )
    brokers: int | None = Field(
        default=None,
        ge=1,
        le=MAX_NODES,
        description="nodes of the embedded Kafka on this machine, each a broker and a KRaft "
        "controller; node N listens on port and controller_port plus 10*(N-1); "
        "unset: as its storage was made, else 1",
    )
    secure: bool | None = Field(
        default=None,
        description="embedded broker with SASL/SCRAM over TLS and ACLs, Redis with a password; "
        "unset: as the broker was last started",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: Path | None = Field(default=None, description="PEM file of trusted CAs")
    client_options: dict[str, str] = Field(
        default_factory=dict, description="extra librdkafka properties for Python clients"
    )
    spark_options: dict[str, str] = Field(
        default_factory=dict,
        description="extra Java client properties for Spark's connector (without 'kafka.')",
    )
    timeout_s: float = Field(default=10.0, gt=0, description="admin and metadata request timeout")

    @model_validator(mode="after")
    def _node_ports(self) -> KafkaSettings:
        self.check_node_ports()
        return self

    def check_node_ports(self) -> None:
        """The embedded nodes' ports exist and are distinct; ValueError if not."""
        if not self.embedded:
            return
        ports = [port for node in range(1, self.nodes + 1) for port in self.node_ports(node)]
        if max(ports) > 65535 or len(set(ports)) != len(ports):
            raise ValueError(
                f"{self.nodes} embedded Kafka nodes from port {self.port} and controller_port "
                f"{self.controller_port} need ports {sorted(ports)}: each at most 65535 and "
                "none twice"
            )

    @property
    def embedded(self) -> bool:
        return self.bootstrap_servers is None

    @property
    def nodes(self) -> int:
        """How many nodes the embedded Kafka has."""
        return self.brokers or 1

    def node_ports(self, node: int) -> tuple[int, int]:
        """Node ``node``'s (1, 2, …) client and controller ports."""
        step = NODE_PORT_STEP * (node - 1)
        return self.port + step, self.controller_port + step

    @property
    def bootstrap(self) -> str:
        """The external cluster's servers, or every embedded node's client address."""
        if self.bootstrap_servers:
            return self.bootstrap_servers
        nodes = range(1, self.nodes + 1)
        return ",".join(f"{self.host}:{self.node_ports(node)[0]}" for node in nodes)

    def client_config(self) -> dict[str, str]:
        """librdkafka properties for confluent-kafka producers, consumers and admins."""
        config = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism is not None:
            config["sasl.mechanism"] = self.sasl_mechanism
            config["sasl.username"] = self.sasl_username or ""
            config["sasl.password"] = self._password()
        if self.ssl_ca_location is not None:
            config["ssl.ca.location"] = str(self.ssl_ca_location)
        config.update(self.client_options)
        return config

    def spark_kafka_options(self) -> dict[str, str]:
        """Options for Spark's Kafka source and sink (Java client names, ``kafka.`` prefix)."""
        config = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism is not None:
            config["sasl.mechanism"] = self.sasl_mechanism
            module = _JAAS_MODULES[self.sasl_mechanism]
            user = _jaas_quote(self.sasl_username or "")
            password = _jaas_quote(self._password())
            config["sasl.jaas.config"] = (
                f'{module} required username="{user}" password="{password}";'
            )
        if self.ssl_ca_location is not None:
            # Java clients read PEM trust stores directly since Kafka 2.7 (KIP-651).
            config["ssl.truststore.type"] = "PEM"
            config["ssl.truststore.location"] = str(self.ssl_ca_location)
        config.update(self.spark_options)
        return {f"kafka.{key}": value for key, value in config.items()}

    def _password(self) -> str:
        return self.sasl_password.get_secret_value() if self.sasl_password else ""


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


class ApiSettings(_Section):
    """The kappaflow service: the HTTP API over the jobs, their results and the lake."""

    host: str = Field(
        default="127.0.0.1", description="address the service listens on (loopback only)"
    )
    port: int = Field(default=8780, ge=1, le=65535, description="the service's port")
    sql_timeout_s: float = Field(
        default=10.0, gt=0, description="a SQL query over the lake is interrupted after this"
    )
    sql_max_rows: int = Field(
        default=10_000, ge=1, description="a SQL query over the lake answers at most this many rows"
    )
    push_backlog: int = Field(
        default=10_000,
        ge=1,
        description="changes a push subscriber may fall behind before it is dropped",
    )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


_MASTER = re.compile(r"^(local(\[(\*|\d+)(,\d+)?\])?|spark://.+|yarn|k8s://.+)$")


class SparkSettings(_Section):
    """How the processing engine runs."""

    master: str = Field(
        default="local[*]", description="local[*], spark://host:7077, yarn, k8s://…"
    )
    driver_memory: str = Field(default="2g", description="spark.driver.memory for job drivers")
    # One state partition per core: each is a task per micro-batch, and on a small machine
    # the tasks' fixed cost, not the work, sets the batch time, so more partitions than
    # cores only slow a batch down. Checkpoints keep the number they started with.
    shuffle_partitions: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        description="spark.sql.shuffle.partitions (default: this machine's cores)",
    )
    # A query with nothing to read asks Kafka for new offsets at every trigger: at 0 it
    # does so every 10 ms, which on a small machine costs the running queries their CPU.
    trigger_interval_ms: int = Field(
        default=250,
        ge=0,
        description="least time between a job's micro-batch starts (0: back to back)",
    )
    ui: bool = Field(default=False, description="start the Spark web UI")
    cluster_host: str = Field(
        default="127.0.0.1", description="address `kappaflow spark start`'s master and workers use"
    )
    cluster_port: int = Field(
        default=7077, ge=1, le=65535, description="that standalone master's port"
    )
    cluster_ui_port: int = Field(
        default=8090, ge=1, le=65535, description="that master's web UI (and JSON status) port"
    )
    cluster_daemon_memory: str = Field(
        default="512m", description="heap of that master and of each worker daemon"
    )
    conf: dict[str, str] = Field(default_factory=dict, description="any further spark.* options")

    @field_validator("master")
    @classmethod
    def _known_master(cls, value: str) -> str:
        if not _MASTER.match(value):
            raise ValueError(
                f"unknown Spark master {value!r}: use local[*], local[N], spark://host:port, "
                "yarn or k8s://https://host:port"
            )
        return value


class RedisSettings(_Section):
    """The serving store."""

    url: str | None = Field(
        default=None, description="redis://host:port/db of an external Redis; unset = embedded"
    )
    host: str = Field(default="127.0.0.1", description="address the embedded Redis listens on")
    port: int = Field(default=6379, ge=1, le=65535, description="embedded Redis port")
    binary: Path | None = Field(
        default=None, description="redis-server to run; default: PATH, then the bundled one"
    )
    username: str | None = Field(default=None, description="Redis ACL user of the clients")
    password: SecretStr | None = Field(default=None, description="that user's password")

    @property
    def secret(self) -> str | None:
        """The password in clear, for the client (None: no password)."""
        return self.password.get_secret_value() if self.password is not None else None

    @property
    def embedded(self) -> bool:
        return self.url is None

    @property
    def effective_url(self) -> str:
        return self.url or f"redis://{self.host}:{self.port}/0"


class PostgresSettings(_Section):
    """PostgreSQL, the database the ``kf.postgres()`` sink writes to: an external server
    given by a DSN, or the embedded one (``kappaflow postgres start``)."""

    dsn: str | None = Field(
        default=None,
        description="postgresql://user:password@host:port/db of an external server; "
        "unset = embedded",
    )
    host: str = Field(default="127.0.0.1", description="address the embedded server listens on")
    # Not 5432: a server installed from the system's packages may run there as a service.
    port: int = Field(default=15432, ge=1, le=65535, description="embedded server's port")
    database: str = Field(default="kappaflow", description="the embedded server's database")
    user: str = Field(default="kappaflow", description="the embedded server's superuser")
    bin_dir: Path | None = Field(
        default=None,
        description="folder of initdb and postgres; default: the newest under "
        "/usr/lib/postgresql, then PATH",
    )

    @property
    def embedded(self) -> bool:
        return self.dsn is None

    @property
    def effective_dsn(self) -> str:
        """The DSN clients connect with (libpq's URI form)."""
        return self.dsn or f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"


class MqttSettings(_Section):
    """Where devices publish over MQTT: an external broker, or the embedded one."""

    url: str | None = Field(
        default=None, description="mqtt://host:port of an external broker; unset = embedded"
    )
    host: str = Field(default="127.0.0.1", description="address the embedded broker listens on")
    # Not 1883: a broker installed from the system's packages may run there as a service.
    port: int = Field(default=11883, ge=1, le=65535, description="embedded broker's port")
    binary: Path | None = Field(
        default=None, description="mosquitto to run; default: PATH and sbin, then amqtt"
    )

    @field_validator("url")
    @classmethod
    def _mqtt_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"mqtt://[^/:]+(:\d{1,5})?/?", value):
            raise ValueError(f"{value!r} is not mqtt://host[:port]")
        return value

    @property
    def embedded(self) -> bool:
        return self.url is None

    @property
    def address(self) -> tuple[str, int]:
        """The broker's host and port, embedded or external."""
        if self.url is None:
            return self.host, self.port
        host, _, port = self.url.removeprefix("mqtt://").rstrip("/").partition(":")
        return host, int(port) if port else 1883

    @property
    def effective_url(self) -> str:
        host, port = self.address
        return f"mqtt://{host}:{port}"


class MirrorSettings(_Section):
    """Replication to a backup cluster: MirrorMaker 2 from the configured Kafka (the
    primary) to ``target``, topic names unchanged, consumer groups' offsets translated."""

    target: str | None = Field(
        default=None, description="host:port[,host:port] of the backup cluster"
    )
    target_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = (
        "PLAINTEXT"
    )
    target_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    target_sasl_username: str | None = None
    target_sasl_password: SecretStr | None = None
    target_ssl_ca_location: Path | None = Field(
        default=None, description="PEM file of the CAs the backup's certificates chain to"
    )
    topics: str = Field(
        default=".*", description="regex of the topics to replicate (MirrorMaker's own excluded)"
    )
    groups: str = Field(
        default=".*", description="regex of the consumer groups whose offsets to translate"
    )
    # MirrorMaker's defaults are 60 s: a consumer failing over then re-reads up to a
    # minute's worth more than it would with a tighter interval.
    sync_interval_s: int = Field(
        default=10,
        ge=1,
        description="how often checkpoints are emitted, group offsets synced to the backup "
        "and the latest offset mapping written",
    )
    refresh_interval_s: int = Field(
        default=30, ge=1, description="how often new topics and groups are looked for"
    )
    offset_lag_max: int = Field(
        default=100,
        ge=0,
        description="records a partition may run past its last offset mapping before a new "
        "one is written: what a failed-over consumer re-reads, at most",
    )
    replication_factor: int = Field(
        default=-1,
        ge=-1,
        description="replicas of the topics the mirror creates (-1: the cluster's default)",
    )
    heap: str = Field(default="512m", description="MirrorMaker's JVM heap (-Xmx)")

    def target_kafka(self) -> KafkaSettings:
        """The backup cluster as Kafka settings, for clients of either kind."""
        return KafkaSettings(
            bootstrap_servers=self.target,
            security_protocol=self.target_security_protocol,
            sasl_mechanism=self.target_sasl_mechanism,
            sasl_username=self.target_sasl_username,
            sasl_password=self.target_sasl_password,
            ssl_ca_location=self.target_ssl_ca_location,
        )


class ConnectSettings(_Section):
    """The Kafka Connect worker for change data capture (``kappaflow connect start``): a
    distributed-mode worker whose configuration, offsets and status live in topics of the
    configured Kafka, with Debezium's PostgreSQL connector on its plugin path."""

    host: str = Field(default="127.0.0.1", description="address its REST API listens on")
    # Not 8083: Connect's default, which another worker on the machine may hold.
    port: int = Field(default=18083, ge=1, le=65535, description="its REST API's port")
    group_id: str = Field(
        default="kappaflow-connect",
        description="the Connect cluster's group; it names its internal topics too",
    )
    replication_factor: int = Field(
        default=-1,
        ge=-1,
        description="replicas of its internal topics (-1: the cluster's default)",
    )
    heap: str = Field(default="512m", description="the worker's JVM heap (-Xmx)")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class RegistrySettings(_Section):
    """The schema registry (``kappaflow registry start``): the Confluent Schema Registry
    API over a compacted topic of the configured Kafka, for Avro sources (``kf.avro``)."""

    host: str = Field(default="127.0.0.1", description="address its REST API listens on")
    # Not 8081: Confluent's default, which another registry on the machine may hold.
    port: int = Field(default=18081, ge=1, le=65535, description="its REST API's port")
    topic: str = Field(default="_schemas", description="the compacted topic it keeps schemas in")
    compatibility: Literal[
        "NONE",
        "BACKWARD",
        "BACKWARD_TRANSITIVE",
        "FORWARD",
        "FORWARD_TRANSITIVE",
        "FULL",
        "FULL_TRANSITIVE",
    ] = Field(default="BACKWARD", description="the compatibility level of subjects without one")
    external_url: str | None = Field(
        default=None,
        description="an external registry's URL (Confluent-compatible); default: the embedded one",
    )

    @property
    def embedded(self) -> bool:
        return self.external_url is None

    @property
    def url(self) -> str:
        return self.external_url or f"http://{self.host}:{self.port}"


class Settings(BaseSettings):
    """Everything configurable in kappaflow, validated once, immutable afterwards."""

    model_config = SettingsConfigDict(
        env_prefix="KAPPAFLOW_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    state_dir: Path = Field(
        default=Path(".kappaflow"),
        description="where embedded services, checkpoints, job logs and jars live",
    )
    jars_dir: Path | None = Field(
        default=None, description="resolved JVM artifacts; default: <state_dir>/jars"
    )
    checkpoint_dir: str | None = Field(
        default=None,
        description="where jobs written on the job API keep their checkpoints: a path or a "
        "Hadoop-compatible URI (hdfs://, s3a://); default: <state_dir>/checkpoints",
    )
    lake_dir: str | None = Field(
        default=None,
        description="the Parquet lake's root: a path or a Hadoop-compatible URI; "
        "default: <state_dir>/lake",
    )
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    mirror: MirrorSettings = Field(default_factory=MirrorSettings)
    connect: ConnectSettings = Field(default_factory=ConnectSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)

    @model_validator(mode="after")
    def _remembered_nodes(self) -> Settings:
        """``kafka.brokers`` unset means as many nodes as the embedded Kafka's storage was
        made with (``<state_dir>/kafka/brokers``), so that every command and job of a
        state directory reaches all of them."""
        if not self.kafka.embedded:
            if (self.kafka.brokers or 1) > 1:
                raise ValueError(
                    "kafka.brokers is for the embedded Kafka; a cluster of your own is "
                    "given by kafka.bootstrap_servers"
                )
            return self
        if self.kafka.brokers is not None:
            return self
        try:
            remembered = int(brokers_marker(self.state_dir).read_text())
        except (OSError, ValueError):
            return self
        kafka = KafkaSettings.model_validate({**self.kafka.model_dump(), "brokers": remembered})
        object.__setattr__(self, "kafka", kafka)
        return self

    @model_validator(mode="after")
    def _secured(self) -> Settings:
        """With the embedded broker secure, every client gets the admin's credentials and
        the state directory's authority, and Redis's clients its password: kept in
        ``<state_dir>/security`` and never typed."""
        if not self.kafka.embedded:
            if self.kafka.secure:
                raise ValueError(
                    "kafka.secure is for the embedded broker; for a cluster of your own set "
                    "kafka.security_protocol, sasl_* and ssl_ca_location"
                )
            return self
        if not self.secure:
            return self
        from kappaflow.security import ADMIN_USER, REDIS_USER, SecurityHome

        home = SecurityHome(self.state_dir)
        made = home.secrets()
        kafka = self.kafka.model_copy(
            update={
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_username": self.kafka.sasl_username or ADMIN_USER,
                "sasl_password": self.kafka.sasl_password or SecretStr(made.admin_password),
                "ssl_ca_location": self.kafka.ssl_ca_location or home.ca_cert,
            }
        )
        object.__setattr__(self, "kafka", kafka)
        if self.redis.embedded:
            redis = self.redis.model_copy(
                update={
                    "username": self.redis.username or REDIS_USER,
                    "password": self.redis.password or SecretStr(made.redis_password),
                }
            )
            object.__setattr__(self, "redis", redis)
        return self

    @property
    def secure(self) -> bool:
        """True if the embedded services run secured: as ``kafka.secure`` says, or, where
        it is unset, as the embedded broker was last started."""
        if not self.kafka.embedded:
            return False
        if self.kafka.secure is not None:
            return self.kafka.secure
        return secure_marker(self.state_dir).exists()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _config_file.get()
        if config_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)

    @property
    def jars_path(self) -> Path:
        return self.jars_dir if self.jars_dir is not None else self.state_dir / "jars"

    @property
    def checkpoint_root(self) -> Path:
        return self.state_dir / "checkpoints"

    @property
    def checkpoint_location(self) -> str:
        """The checkpoints' root for jobs on the job API (a local path or a URI)."""
        if self.checkpoint_dir is not None:
            return self.checkpoint_dir
        return str(self.checkpoint_root.resolve())

    @property
    def lake_root(self) -> str:
        """The Parquet lake's root (a local path or a URI)."""
        return (
            self.lake_dir if self.lake_dir is not None else str((self.state_dir / "lake").resolve())
        )

    @property
    def jobs_dir(self) -> Path:
        return self.state_dir / "jobs"


def settings_json(settings: Settings) -> str:
    """``settings`` as JSON that ``Settings.model_validate_json`` reads back whole, secrets
    included: how a command hands its settings to a process it starts (the service, the
    schema registry)."""

    def plain(value: Any) -> Any:
        if isinstance(value, SecretStr):
            return value.get_secret_value()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if isinstance(value, Path):
            return str(value)
        return value

    return json.dumps(plain(settings.model_dump()))


def secure_marker(state_dir: Path) -> Path:
    """The file whose presence says the embedded broker was last started secure."""
    return state_dir / "kafka" / "secure"


def brokers_marker(state_dir: Path) -> Path:
    """The file that says how many nodes the embedded Kafka's storage was made with."""
    return state_dir / "kafka" / "brokers"


@dataclass(frozen=True)
class SettingsOverrides:
    """Settings given explicitly, over the environment, the file and the defaults: the
    command line's global flags, and what a job part or a benchmark sets for a driver of
    its own. A job's record keeps them, so that its driver resolves the settings the
    starting command did; secrets are never among them (they stay in the environment or
    the file). A field left ``None`` overrides nothing.
    """

    state_dir: Path | None = None
    bootstrap_servers: str | None = None
    redis_url: str | None = None
    spark_master: str | None = None
    spark_shuffle_partitions: int | None = None
    spark_driver_memory: str | None = None
    #: Merged over ``spark.conf`` from the environment and the file (a key set here wins).
    spark_conf: Mapping[str, str] | None = None

    def over(self, base: SettingsOverrides) -> SettingsOverrides:
        """These overrides on top of ``base``: a field set here wins."""
        mine = {k: v for k, v in self.to_json().items() if v is not None}
        return SettingsOverrides.from_json({**base.to_json(), **mine})

    def fields(self) -> dict[str, Any]:
        """The overrides as ``Settings`` field values (nested sections as dicts)."""
        sections: dict[str, dict[str, Any]] = {
            "kafka": {"bootstrap_servers": self.bootstrap_servers},
            "redis": {"url": self.redis_url},
            "spark": {
                "master": self.spark_master,
                "shuffle_partitions": self.spark_shuffle_partitions,
                "driver_memory": self.spark_driver_memory,
                "conf": dict(self.spark_conf) if self.spark_conf is not None else None,
            },
        }
        found: dict[str, Any] = {"state_dir": self.state_dir}
        for name, values in sections.items():
            found[name] = {k: v for k, v in values.items() if v is not None}
        return {k: v for k, v in found.items() if v is not None and v != {}}

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, with ``state_dir`` made absolute (a driver may run elsewhere)."""
        values = asdict(self)
        if self.state_dir is not None:
            values["state_dir"] = str(self.state_dir.resolve())
        if self.spark_conf is not None:
            values["spark_conf"] = dict(self.spark_conf)
        return values

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> SettingsOverrides:
        """Read :meth:`to_json`'s form, or the nested ``{"kafka": {...}, ...}`` form job
        records of kappaflow 0.1.0 hold."""
        if {"kafka", "spark", "redis"} & set(values):
            kafka, spark, redis = (values.get(k) or {} for k in ("kafka", "spark", "redis"))
            values = {
                "state_dir": values.get("state_dir"),
                "bootstrap_servers": kafka.get("bootstrap_servers"),
                "redis_url": redis.get("url"),
                "spark_master": spark.get("master"),
                "spark_shuffle_partitions": spark.get("shuffle_partitions"),
                "spark_driver_memory": spark.get("driver_memory"),
                "spark_conf": spark.get("conf"),
            }
        state_dir = values.get("state_dir")
        return cls(**{**values, "state_dir": Path(state_dir) if state_dir else None})


def load_settings(
    config_file: Path | None = None,
    overrides: SettingsOverrides | None = None,
    **fields: Any,
) -> Settings:
    """Resolve settings from overrides, environment, the TOML file and defaults.

    ``fields`` use the field names (``state_dir=...``, ``kafka={"port": 19092}``) and go
    over ``overrides``; ``None`` values are ignored so CLI flags that were not given do
    not mask lower sources.
    """
    path = _find_config_file(config_file)
    given = (overrides or SettingsOverrides()).fields()
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, Mapping) and isinstance(given.get(key), dict):
            given[key] = {**given[key], **value}
        else:
            given[key] = value
    token = _config_file.set(path)
    try:
        return Settings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        source = f" in {path}" if path is not None else ""
        raise InvalidSettingError(
            f"invalid setting {where}{source}: {first['msg']}{more}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigSyntaxError(f"cannot parse {path}: {exc}") from None
    finally:
        _config_file.reset(token)


def _find_config_file(explicit: Path | None) -> Path | None:
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigFileNotFoundError(f"configuration file {explicit} does not exist")
        return explicit
    from_env = os.environ.get("KAPPAFLOW_CONFIG")
    if from_env:
        return _find_config_file(Path(from_env))
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None
