"""``setup``, ``kafka``, ``redis``, ``mqtt``, ``postgres``, ``up``, ``down``, ``status``:
the embedded services."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import click

from kappaflow import services as svc
from kappaflow.api.server import EmbeddedApi
from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import iso_from_epoch_s, json_line, say, table
from kappaflow.errors import ExternalServiceError
from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.mqtt.broker import EmbeddedMqtt
from kappaflow.postgresql.server import EmbeddedPostgres
from kappaflow.serving.redis_server import EmbeddedRedis, find_redis_server
from kappaflow.settings import MAX_NODES


@click.command()
@pass_context
def setup(ctx: Context) -> None:
    """Check prerequisites, resolve the JVM artifacts from Maven Central, write the Spark
    driver's class-data archive and install an MQTT broker and a PostgreSQL server if
    there are none (idempotent)."""
    from kappaflow.install import find_java, resolve_all
    from kappaflow.install.engine import build_engine
    from kappaflow.install.localfs import build_local_fs
    from kappaflow.iot.jvm.scorer import build_scorer
    from kappaflow.mqtt.setup import ensure_mqtt_broker
    from kappaflow.postgresql.setup import ensure_postgres_server
    from kappaflow.spark.cds import build_archive

    settings = ctx.settings
    java = find_java()
    say(f"java {java.version} at {java.executable}")
    for line in resolve_all(settings):
        say(f"resolved {line}")
    for build in (build_engine, build_local_fs, build_scorer):
        built = build(settings)
        if built is not None:
            say(built)
    archived = build_archive(settings)
    if archived is not None:
        say(archived)
    say(f"redis-server at {find_redis_server(settings.redis.binary)}")
    say(ensure_postgres_server(settings, say))
    say(ensure_mqtt_broker(settings, say))
    say(f"jars ready in {settings.jars_path}")


def _show(row: Mapping[str, object], as_json: bool) -> None:
    if as_json:
        json_line(row)
    else:
        table(None, list(row), [list(row.values())])


def _embedded_kafka(ctx: Context) -> EmbeddedBroker:
    if not ctx.settings.kafka.embedded:
        raise ExternalServiceError(
            f"Kafka is external ({ctx.settings.kafka.bootstrap}): kappaflow does not manage it"
        )
    return EmbeddedBroker(ctx.settings)


def _embedded_redis(ctx: Context) -> EmbeddedRedis:
    if not ctx.settings.redis.embedded:
        raise ExternalServiceError(
            "Redis is external (redis.url is set): kappaflow does not manage it"
        )
    return EmbeddedRedis(ctx.settings)


def _embedded_mqtt(ctx: Context) -> EmbeddedMqtt:
    if not ctx.settings.mqtt.embedded:
        raise ExternalServiceError(
            "the MQTT broker is external (mqtt.url is set): kappaflow does not manage it"
        )
    return EmbeddedMqtt(ctx.settings)


def _embedded_postgres(ctx: Context) -> EmbeddedPostgres:
    if not ctx.settings.postgres.embedded:
        raise ExternalServiceError(
            "PostgreSQL is external (postgres.dsn is set): kappaflow does not manage it"
        )
    return EmbeddedPostgres(ctx.settings)


@click.group()
def kafka() -> None:
    """The embedded Kafka: one KRaft broker, or a cluster of several on this machine."""


def _secure_option(command: Callable[..., None]) -> Callable[..., None]:
    return click.option(
        "--secure/--no-secure",
        default=None,
        help="SASL/SCRAM over TLS with ACLs, and Redis with a password (kept for later "
        "commands) [default: as last started, or kafka.secure]",
    )(command)


def _brokers_option(command: Callable[..., None]) -> Callable[..., None]:
    return click.option(
        "--brokers",
        type=click.IntRange(1, MAX_NODES),
        help="nodes of the embedded Kafka, each a broker and a controller on ports 10 "
        "apart (kept for later commands) [default: as its storage was made, or "
        "kafka.brokers, else 1]",
    )(command)


def _nodes(indexes: list[int]) -> str:
    return ("node " if len(indexes) == 1 else "nodes ") + ", ".join(map(str, indexes))


@kafka.command("start")
@_secure_option
@_brokers_option
@pass_context
def kafka_start(ctx: Context, secure: bool | None, brokers: int | None) -> None:
    """Start the broker (each node that does not run) and wait until it answers."""
    if not ctx.settings.kafka.embedded:
        _embedded_kafka(ctx)
    broker = EmbeddedBroker(ctx.secured(secure, brokers))
    for node in broker.nodes:
        stale = node.process.clear_stale()
        if stale is not None:
            of = f" of node {node.index}" if len(broker.nodes) > 1 else ""
            say(f"removed a stale pid file{of} (pid {stale} is not a kappaflow broker)")
    started = broker.start_nodes()
    mode = " (SASL_SSL, SCRAM-SHA-512, ACLs)" if broker.secure else ""
    if 0 < len(started) < len(broker.nodes):
        addresses = ",".join(broker.nodes[i - 1].address for i in started)
        say(f"kafka {_nodes(started)} started on {addresses}{mode}")
    else:
        say(f"kafka {'started' if started else 'already running'} on {broker.bootstrap}{mode}")


@kafka.command("stop")
@click.option("--timeout", default=30.0, show_default=True, help="seconds before SIGKILL")
@pass_context
def kafka_stop(ctx: Context, timeout: float) -> None:
    """Stop the broker (every node): controlled shutdown, then SIGKILL after the timeout."""
    broker = _embedded_kafka(ctx)
    stopped = broker.stop_nodes(timeout=timeout)
    if not stopped:
        say("kafka was not running")
    elif len(stopped) < len(broker.nodes):
        say(f"kafka stopped ({_nodes(stopped)} of {len(broker.nodes)} were running)")
    else:
        say("kafka stopped")


@kafka.command("status")
@click.option("--json", "as_json", is_flag=True, help="print one JSON line per node")
@pass_context
def kafka_status(ctx: Context, as_json: bool) -> None:
    """Whether each node runs, its pid, address and data directory."""
    rows = [
        {
            "node": status.node,
            "state": status.state.value,
            "pid": status.pid,
            "bootstrap": status.bootstrap,
            "data_dir": str(status.data_dir),
            "started_at": iso_from_epoch_s(status.started_at),
        }
        for status in _embedded_kafka(ctx).statuses()
    ]
    if as_json:
        for row in rows:
            json_line(row)
    else:
        table(None, list(rows[0]), [list(row.values()) for row in rows])


@kafka.command("logs")
@click.option("-n", "--lines", default=50, show_default=True, help="how many lines")
@click.option("--node", default=1, show_default=True, type=click.IntRange(min=1), help="whose")
@pass_context
def kafka_logs(ctx: Context, lines: int, node: int) -> None:
    """The last lines of a node's server.log."""
    broker = _embedded_kafka(ctx)
    if node > len(broker.nodes):
        raise click.BadParameter(
            f"the embedded Kafka has {len(broker.nodes)} node(s)", param_hint="--node"
        )
    for line in broker.logs(lines, node=node):
        click.echo(line)


def _url_service(
    name: str,
    what: str,
    summary: str,
    embedded: Callable[[Context], EmbeddedRedis | EmbeddedMqtt | EmbeddedApi | EmbeddedPostgres],
    ready: str,
    keeps: str,
) -> click.Group:
    """The ``start``, ``stop`` and ``status`` commands of the embedded service ``what``,
    which has a URL: ``ready`` says what start waits for, ``keeps`` what a stop keeps."""

    @click.group(name=name, help=summary)
    def group() -> None:
        pass

    @group.command("start", help=f"Start {what} and wait until it {ready}.")
    @pass_context
    def start(ctx: Context) -> None:
        service = embedded(ctx)
        started = service.start()
        say(f"{name} {'started' if started else 'already running'} on {service.url}")

    @group.command("stop", help=f"Stop {what} ({keeps}).")
    @pass_context
    def stop(ctx: Context) -> None:
        stopped = embedded(ctx).stop()
        say(f"{name} stopped" if stopped else f"{name} was not running")

    @group.command("status", help=f"Whether {what} runs, its pid and address.")
    @click.option("--json", "as_json", is_flag=True, help="print one JSON object")
    @pass_context
    def status(ctx: Context, as_json: bool) -> None:
        found = embedded(ctx).status()
        row = {
            "state": found.state.value,
            "pid": found.pid,
            "url": found.url,
            "started_at": iso_from_epoch_s(found.started_at),
        }
        _show(row, as_json)

    return group


redis = _url_service(
    "redis",
    "Redis",
    "The embedded Redis, the serving store.",
    _embedded_redis,
    "answers PING",
    "its append-only file keeps the data",
)
mqtt = _url_service(
    "mqtt",
    "the MQTT broker",
    "The embedded MQTT broker devices publish to (mosquitto, else amqtt).",
    _embedded_mqtt,
    "accepts a connection",
    "mosquitto keeps its sessions and queued messages on disk",
)
postgres = _url_service(
    "postgres",
    "PostgreSQL",
    "The embedded PostgreSQL, the database of kf.postgres() sinks (docs/postgres.md).",
    _embedded_postgres,
    "answers (initialised on first start, with wal_level=logical)",
    "its data directory keeps the tables",
)
api = _url_service(
    "api",
    "the kappaflow service",
    "The kappaflow service: jobs, their status and results over HTTP (docs/api.md).",
    lambda ctx: EmbeddedApi(ctx.settings),
    "answers",
    "jobs and their results are kept by the jobs and the serving store",
)


@click.command()
@_secure_option
@_brokers_option
@pass_context
def up(ctx: Context, secure: bool | None, brokers: int | None) -> None:
    """Start every embedded service (Kafka, Redis, MQTT) and the kappaflow service (the
    HTTP API) where they are not running."""
    for line in svc.up(ctx.secured(secure, brokers)):
        say(line)


@click.command()
@pass_context
def down(ctx: Context) -> None:
    """Stop the kappaflow service and every embedded service."""
    for line in svc.down(ctx.settings):
        say(line)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print JSON lines")
@pass_context
def status(ctx: Context, as_json: bool) -> None:
    """The state of every service, embedded or external."""
    rows = svc.status(ctx.settings)
    if as_json:
        for row in rows:
            json_line(row.as_dict())
    else:
        table(
            None,
            ["service", "state", "address", "pid"],
            [[r.service, r.state, r.address, r.pid] for r in rows],
        )


COMMANDS = (setup, kafka, redis, mqtt, postgres, api, up, down, status)
