"""``ysb``, ``ysb-sweep`` and ``ysb-generator``: the Yahoo Streaming Benchmark."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import say, table
from kappaflow.errors import CommandLineError, KappaflowError
from kappaflow.kafka.topics import DEFAULT_PARTITIONS
from kappaflow.services import embedded_services

# Options `ysb` and `ysb-sweep` share.
sink_option = click.option(
    "--sink", type=click.Choice(["redis", "kafka"]), default="redis", show_default=True
)
warmup_option = click.option(
    "--warmup",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="seconds of events at the run's rate sent and counted before the measured run "
    "(the JVM engines' JIT compilers are busy for a minute or more)",
)
processes_option = click.option(
    "--processes", type=click.IntRange(min=1), default=1, show_default=True
)
partitions_option = click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=DEFAULT_PARTITIONS,
    show_default="this machine's cores",
    help="of the events topic, and Spark's shuffle partitions (the original used 1)",
)
out_option = click.option(
    "--out", "out_dir", required=True, type=click.Path(path_type=Path, file_okay=False)
)


@click.command("ysb")
@click.option(
    "--engine",
    type=click.Choice(["kappaflow", "spark", "spark-rt", "flink", "quix"]),
    required=True,
    help="kappaflow: the job on kappaflow's job API; spark, spark-rt: the hand-written Spark "
    "pipeline in micro-batch or real-time mode; flink, quix: peers",
)
@sink_option
@click.option("--rate", type=click.IntRange(min=1), required=True, help="events/s offered")
@click.option(
    "--duration", type=click.FloatRange(min=0, min_open=True), required=True, help="seconds"
)
@warmup_option
@click.option(
    "--aggregate",
    type=click.Choice(["batch", "state"]),
    help="spark/redis: per-batch counts added to Redis (default) or Spark's state store",
)
@click.option(
    "--join",
    type=click.Choice(["table", "map"]),
    help="kappaflow (the job API's job): ads to campaigns by a reference table from a "
    "compacted topic, or a map literal in the plan [default: table]",
)
@click.option(
    "--rt-batch",
    type=float,
    metavar="SECONDS",
    help="spark-rt: how long each real-time batch runs [default: 30]",
)
@processes_option
@partitions_option
@out_option
@pass_context
def ysb(
    ctx: Context,
    engine: str,
    sink: str,
    rate: int,
    duration: float,
    warmup: float,
    aggregate: str | None,
    join: str | None,
    rt_batch: float | None,
    processes: int,
    partitions: int,
    out_dir: Path,
) -> None:
    """One Yahoo Streaming Benchmark run: windows' latency, rates and a correctness check."""
    from kappaflow_bench.ysb.bench import RunSpec, run

    spec = RunSpec(
        engine, sink, rate, duration, processes, partitions, warmup, aggregate, rt_batch, join
    )
    spec.validate()
    with embedded_services(ctx.settings, say):
        result = run(ctx.settings, spec, out_dir, overrides=ctx.overrides, say=say)
    table(f"YSB {engine} / {sink}", ["measure", "value"], result.summary_rows())
    say(f"wrote {out_dir}/result.json, seen.txt, updated.txt, latency.png")
    if result.mismatched_windows:
        raise KappaflowError(
            f"{result.mismatched_windows} windows do not match the events in Kafka "
            f"(see {out_dir / 'result.json'})"
        )


def _ints(option: str, text: str) -> list[int]:
    try:
        return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CommandLineError(
            f"{option} {text!r} is not a comma-separated list of integers"
        ) from None


@click.command("ysb-sweep")
@click.option(
    "--engines",
    default="spark,spark-rt,flink,quix",
    show_default=True,
    help="comma-separated, each swept on its own",
)
@sink_option
@click.option(
    "--rates",
    default="10000,20000,50000,100000,200000",
    show_default=True,
    help="events/s, rising; an engine stops at its first rate not sustained",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="seconds of each run",
)
@warmup_option
@click.option(
    "--max-p99",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="ms: the window p99 a sustained rate keeps",
)
@processes_option
@partitions_option
@out_option
@pass_context
def ysb_sweep(
    ctx: Context,
    engines: str,
    sink: str,
    rates: str,
    duration: float,
    warmup: float,
    max_p99: int,
    processes: int,
    partitions: int,
    out_dir: Path,
) -> None:
    """Raise the rate per engine until window p99 passes --max-p99 or the engine falls
    behind: each engine's maximum sustainable rate, sweep.json and p99.png."""
    from kappaflow_bench.ysb.bench import RunSpec
    from kappaflow_bench.ysb.sweep import COLUMNS, sweep, validate

    names = [e.strip() for e in engines.split(",") if e.strip()]
    steps = _ints("--rates", rates)
    base = RunSpec("-", sink, 1, duration, processes, partitions, warmup)
    validate(names, steps, base)
    with embedded_services(ctx.settings, say):
        result = sweep(
            ctx.settings,
            names,
            steps,
            out_dir,
            base=base,
            max_p99_ms=max_p99,
            overrides=ctx.overrides,
            say=say,
        )
    table(f"YSB sweep, {sink} sink", COLUMNS, [p.row() for p in result.points])
    table(
        "maximum sustainable rate",
        ["engine", "events/s"],
        [[e, f"{r:,}" if (r := result.max_sustainable(e)) else "none"] for e in names],
    )
    say(f"wrote {out_dir}/sweep.json, p99.png and a directory per run")


@click.command("ysb-generator")
@click.option("--events", type=click.IntRange(min=1), default=3_000_000, show_default=True)
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=DEFAULT_PARTITIONS,
    show_default="this machine's cores",
)
@pass_context
def ysb_generator(ctx: Context, events: int, processes: int, partitions: int) -> None:
    """The YSB generator's maximum rate alone: EVENTS sent as fast as it can."""
    from kappaflow.kafka.topics import create_topic, delete_topic
    from kappaflow_bench.ysb.generator import run_processes

    with embedded_services(ctx.settings, say):
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


COMMANDS = (ysb, ysb_sweep, ysb_generator)
