"""``setup``, ``kafka``, ``redis``, ``up``, ``down``, ``status``: the embedded services."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import click

from kappaflow import services as svc
from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, table, when
from kappaflow.errors import ExternalServiceError
from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.serving.redis_server import EmbeddedRedis, find_redis_server


@click.command()
@pass_context
def setup(ctx: Context) -> None:
    """Check prerequisites and resolve the JVM artifacts from Maven Central (idempotent)."""
    from kappaflow.install import find_java, resolve_all
    from kappaflow.install.localfs import build_local_fs

    settings = ctx.settings
    java = find_java()
    say(f"java {java.version} at {java.executable}")
    for line in resolve_all(settings):
        say(f"resolved {line}")
    built = build_local_fs(settings)
    if built is not None:
        say(built)
    say(f"redis-server at {find_redis_server(settings.redis.binary)}")
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


@click.group()
def kafka() -> None:
    """The embedded single-node Kafka broker (KRaft)."""


@kafka.command("start")
@pass_context
def kafka_start(ctx: Context) -> None:
    """Start the broker and wait until it answers."""
    broker = _embedded_kafka(ctx)
    stale = broker.process.clear_stale()
    if stale is not None:
        say(f"removed a stale pid file (pid {stale} is not a kappaflow broker)")
    started = broker.start()
    say(f"kafka {'started' if started else 'already running'} on {broker.bootstrap}")


@kafka.command("stop")
@click.option("--timeout", default=30.0, show_default=True, help="seconds before SIGKILL")
@pass_context
def kafka_stop(ctx: Context, timeout: float) -> None:
    """Stop the broker: controlled shutdown, then SIGKILL after the timeout."""
    stopped = _embedded_kafka(ctx).stop(timeout=timeout)
    say("kafka stopped" if stopped else "kafka was not running")


@kafka.command("status")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@pass_context
def kafka_status(ctx: Context, as_json: bool) -> None:
    """Whether the broker runs, its pid, address and data directory."""
    status = _embedded_kafka(ctx).status()
    row = {
        "state": status.state.value,
        "pid": status.pid,
        "bootstrap": status.bootstrap,
        "data_dir": str(status.data_dir),
        "started_at": when(status.started_at),
    }
    _show(row, as_json)


@kafka.command("logs")
@click.option("-n", "--lines", default=50, show_default=True, help="how many lines")
@pass_context
def kafka_logs(ctx: Context, lines: int) -> None:
    """The last lines of the broker's server.log."""
    for line in _embedded_kafka(ctx).logs(lines):
        click.echo(line)


@click.group()
def redis() -> None:
    """The embedded Redis, the serving store."""


@redis.command("start")
@pass_context
def redis_start(ctx: Context) -> None:
    """Start Redis and wait until it answers PING."""
    store = _embedded_redis(ctx)
    started = store.start()
    say(f"redis {'started' if started else 'already running'} on {store.url}")


@redis.command("stop")
@pass_context
def redis_stop(ctx: Context) -> None:
    """Stop Redis (its append-only file keeps the data)."""
    stopped = _embedded_redis(ctx).stop()
    say("redis stopped" if stopped else "redis was not running")


@redis.command("status")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@pass_context
def redis_status(ctx: Context, as_json: bool) -> None:
    """Whether Redis runs, its pid and address."""
    status = _embedded_redis(ctx).status()
    row = {
        "state": status.state.value,
        "pid": status.pid,
        "url": status.url,
        "started_at": when(status.started_at),
    }
    _show(row, as_json)


@click.command()
@pass_context
def up(ctx: Context) -> None:
    """Start every embedded service (Kafka, Redis) that is not running."""
    for line in svc.up(ctx.settings):
        say(line)


@click.command()
@pass_context
def down(ctx: Context) -> None:
    """Stop every embedded service."""
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


@click.command()
@click.option("--seconds", default=60.0, show_default=True, help="how long to run")
@click.option("--rate", default=500, show_default=True, help="page views per second")
@pass_context
def demo(ctx: Context, seconds: float, rate: int) -> None:
    """Page views counted per page per minute, shown live (Ctrl-C ends it)."""
    from rich.console import Console

    from kappaflow.demo import run_demo

    run_demo(
        ctx.settings,
        seconds=seconds,
        rate=rate,
        console=Console(),
        overrides=ctx.overrides,
        config_file=ctx.config_file,
    )


@click.group()
def bench() -> None:
    """Benchmarks: long runs that print figures and write result files."""


@bench.command("count")
@click.option("--events", default=1_000_000, show_default=True, help="backlog size")
@click.option("--keys", default=10_000, show_default=True, help="distinct keys")
@click.option("--latency-rate", default=20_000, show_default=True, help="events/s, steady")
@click.option("--latency-seconds", default=60.0, show_default=True)
@click.option(
    "--parts",
    default="all",
    show_default=True,
    help="comma-separated: ceiling, throughput, sustained, latency, realtime",
)
@click.option(
    "--out",
    "out_dir",
    default="bench-results/count",
    show_default=True,
    type=click.Path(path_type=Path),
)
@pass_context
def bench_count(
    ctx: Context,
    events: int,
    keys: int,
    latency_rate: int,
    latency_seconds: float,
    parts: str,
    out_dir: Path,
) -> None:
    """Counting throughput (1-minute windows) and latency, with the read ceiling."""
    from kappaflow.bench.counting import PARTS, run

    chosen = PARTS if parts == "all" else tuple(p.strip() for p in parts.split(",") if p.strip())
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown or not chosen:
        raise click.BadParameter(
            f"{', '.join(unknown) or 'nothing'}: pick from {', '.join(PARTS)}", param_hint="--parts"
        )
    svc.up(ctx.settings)
    result = run(
        ctx.settings,
        events=events,
        keys=keys,
        latency_rate=latency_rate,
        latency_seconds=latency_seconds,
        out_dir=out_dir,
        overrides=ctx.overrides,
        parts=chosen,
    )
    table(
        "counting benchmark",
        ["measure", "value"],
        [
            ["events x bytes", f"{result.events} x {result.event_bytes}"],
            ["keys", result.keys],
            ["produce rate (backlog)", _rate(result.produce_rate)],
            ["ceiling: Spark Kafka read", _rate(result.ceiling_spark_rate)],
            ["ceiling: confluent-kafka consumer", _rate(result.ceiling_consumer_rate)],
            [
                "count job, new, on the backlog",
                _rate(result.throughput_rate, result.throughput_seconds),
            ],
            [
                "  as a share of the Spark ceiling",
                f"{result.throughput_rate / result.ceiling_spark_rate:.1%}"
                if result.ceiling_spark_rate and result.throughput_rate
                else "-",
            ],
            [
                "count job, warmed up, fed as fast as possible",
                _rate(result.sustained_rate, result.sustained_seconds),
            ],
            [
                f"micro-batch latency p50 / p99 at {result.latency_rate}/s",
                f"{_s(result.latency_p50_s)} / {_s(result.latency_p99_s)}",
            ],
            [
                f"real-time latency p50 / p99 at {result.realtime_rate}/s",
                f"{_ms(result.realtime_p50_ms)} / {_ms(result.realtime_p99_ms)}",
            ],
        ],
    )
    say(f"wrote {out_dir / 'result.json'}")


@bench.command("count-scale")
@click.option("--keys", default=1_000_000, show_default=True, help="distinct keys")
@click.option("--rate", default=5_000, show_default=True, help="events/s, steady")
@click.option("--seconds", default=240.0, show_default=True, help="how long to send")
@click.option("--speedup", default=1, show_default=True, help="event time vs the clock")
@click.option("--driver-memory", default="4g", show_default=True)
@click.option(
    "--out",
    "out_dir",
    default="bench-results/count-scale",
    show_default=True,
    type=click.Path(path_type=Path),
)
@pass_context
def bench_count_scale(
    ctx: Context,
    keys: int,
    rate: int,
    seconds: float,
    speedup: int,
    driver_memory: str,
    out_dir: Path,
) -> None:
    """Many distinct keys in 1-minute windows: state held, memory, over time."""
    from kappaflow.bench.scale import run_scale

    svc.up(ctx.settings)
    result = run_scale(
        ctx.settings,
        keys=keys,
        rate=rate,
        seconds=seconds,
        speedup=speedup,
        driver_memory=driver_memory,
        out_dir=out_dir,
        overrides=ctx.overrides,
    )
    table(
        "counting at scale",
        ["seconds", "sent", "distinct keys sent", "processed", "keys held", "windows", "RSS"],
        [
            [
                f"{s.at_s:.0f}",
                f"{s.sent:,}",
                f"{s.distinct_keys_sent:,}",
                f"{s.processed:,}",
                f"{s.window_keys:,}",
                s.open_windows,
                f"{s.rss_bytes / 2**30:.2f} GiB",
            ]
            for s in result.samples[:: max(1, len(result.samples) // 20)] + result.samples[-1:]
        ],
    )
    say(
        f"job {result.job_state}; {result.distinct_keys_sent:,} distinct keys; keys held at most "
        f"{result.max_window_keys:,}; driver RSS at most {result.max_rss_bytes / 2**30:.2f} GiB"
    )
    say(f"wrote {out_dir / 'result.json'}")


def _rate(per_second: float, seconds: float | None = None) -> str:
    """Events/s for the table; "-" for a measurement the run did not make."""
    if not per_second:
        return "-"
    return f"{per_second:,.0f}/s" + (f" ({seconds:.0f}s)" if seconds else "")


def _s(value: float | None) -> str:
    return f"{value:.2f}s" if value is not None else "-"


def _ms(value: float | None) -> str:
    return f"{value:.0f}ms" if value is not None else "-"


COMMANDS = (setup, kafka, redis, up, down, status, demo, bench)
