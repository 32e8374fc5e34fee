"""``kappaflow bench ysb`` and ``kappaflow bench ysb-generator``: the Yahoo Streaming Benchmark."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from kappaflow.cli.app import Context, pass_context
from kappaflow.cli.output import say, table
from kappaflow.settings import Settings


@contextmanager
def embedded_services(settings: Settings) -> Iterator[None]:
    """Start the embedded broker and Redis if they are not running; stop only those."""
    from kappaflow.kafka.broker import EmbeddedBroker
    from kappaflow.serving.redis_server import EmbeddedRedis

    started: list[EmbeddedBroker | EmbeddedRedis] = []
    try:
        if settings.kafka.embedded:
            broker = EmbeddedBroker(settings)
            if broker.start():
                started.append(broker)
                say(f"started kafka on {broker.bootstrap}")
        if settings.redis.embedded:
            store = EmbeddedRedis(settings)
            if store.start():
                started.append(store)
                say(f"started redis on {store.url}")
        yield
    finally:
        for service in reversed(started):
            service.stop()
            say(f"stopped {'redis' if isinstance(service, EmbeddedRedis) else 'kafka'}")


@click.command("ysb")
@click.option(
    "--engine",
    type=click.Choice(["spark", "spark-rt", "flink", "quix"]),
    required=True,
    help="spark: micro-batch; spark-rt: Spark's real-time mode; flink, quix: peers",
)
@click.option("--sink", type=click.Choice(["redis", "kafka"]), default="redis", show_default=True)
@click.option("--rate", type=click.IntRange(min=1), required=True, help="events/s offered")
@click.option(
    "--duration", type=click.FloatRange(min=0, min_open=True), required=True, help="seconds"
)
@click.option(
    "--warmup",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="seconds of events at --rate sent and counted before the measured run",
)
@click.option(
    "--aggregate",
    type=click.Choice(["batch", "state"]),
    help="spark/redis: per-batch counts added to Redis (default) or Spark's state store",
)
@click.option(
    "--rt-batch",
    type=float,
    metavar="SECONDS",
    help="spark-rt: how long each real-time batch runs [default: 30]",
)
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="of the events topic, and Spark's shuffle partitions (the original used 1)",
)
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path, file_okay=False))
@pass_context
def ysb(
    ctx: Context,
    engine: str,
    sink: str,
    rate: int,
    duration: float,
    warmup: float,
    aggregate: str | None,
    rt_batch: float | None,
    processes: int,
    partitions: int,
    out_dir: Path,
) -> None:
    """One Yahoo Streaming Benchmark run: windows' latency, rates and a correctness check."""
    from kappaflow.ysb.bench import RunSpec, run

    spec = RunSpec(engine, sink, rate, duration, processes, partitions, warmup, aggregate, rt_batch)
    spec.validate()
    with embedded_services(ctx.settings):
        result = run(ctx.settings, spec, out_dir, overrides=ctx.overrides, say=say)
    table(f"YSB {engine} / {sink}", ["measure", "value"], result.summary_rows())
    say(f"wrote {out_dir}/result.json, seen.txt, updated.txt, latency.png")
    if result.mismatched_windows:
        raise click.ClickException(
            f"{result.mismatched_windows} windows do not match the events in Kafka "
            f"(see {out_dir / 'result.json'})"
        )


@click.command("ysb-generator")
@click.option("--events", type=click.IntRange(min=1), default=3_000_000, show_default=True)
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--partitions", type=click.IntRange(min=1), default=2, show_default=True)
@pass_context
def ysb_generator(ctx: Context, events: int, processes: int, partitions: int) -> None:
    """The YSB generator's maximum rate alone: EVENTS sent as fast as it can."""
    from kappaflow.kafka.topics import create_topic, delete_topic
    from kappaflow.ysb.generator import run_processes

    with embedded_services(ctx.settings):
        topic = f"ysb.generator.{uuid.uuid4().hex[:8]}"
        create_topic(ctx.settings.kafka, topic, partitions=partitions)
        rng = random.Random()
        ads = [[str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(1000)]]
        # A schedule far faster than any machine: every event is due at once, so the
        # generator sends flat out and its achieved rate is its ceiling.
        ceiling = 1_000_000_000
        try:
            stats = run_processes(
                ctx.settings.kafka.client_config(),
                topic,
                rate=ceiling,
                duration_s=events / ceiling,
                ads_per_process=ads * processes,
            )
        finally:
            delete_topic(ctx.settings.kafka, topic)
    table(
        "YSB generator alone",
        ["measure", "value"],
        [
            ["processes", processes],
            ["events", f"{stats.events:,}"],
            ["seconds", f"{stats.seconds:.1f}"],
            ["maximum rate", f"{stats.achieved_rate:,.0f} events/s"],
            ["delivery errors", stats.delivery_errors],
        ],
    )


COMMANDS = (ysb, ysb_generator)
