"""``count`` and ``count-scale``: the counting job's throughput, latency and state."""

from __future__ import annotations

from pathlib import Path

import click

from kappaflow import services as svc
from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import say, table


@click.command("count")
@click.option("--events", default=1_000_000, show_default=True, help="backlog size")
@click.option("--keys", default=10_000, show_default=True, help="distinct keys")
@click.option("--latency-rate", default=20_000, show_default=True, help="events/s, steady")
@click.option("--latency-seconds", default=60.0, show_default=True)
@click.option(
    "--measure",
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
def count(
    ctx: Context,
    events: int,
    keys: int,
    latency_rate: int,
    latency_seconds: float,
    measure: str,
    out_dir: Path,
) -> None:
    """Counting throughput (1-minute windows) and latency, with the read ceiling."""
    from kappaflow_bench.count import MEASUREMENTS, run

    chosen = (
        MEASUREMENTS
        if measure == "all"
        else tuple(m.strip() for m in measure.split(",") if m.strip())
    )
    unknown = sorted(set(chosen) - set(MEASUREMENTS))
    if unknown or not chosen:
        raise click.BadParameter(
            f"{', '.join(unknown) or 'nothing'}: pick from {', '.join(MEASUREMENTS)}",
            param_hint="--measure",
        )
    with svc.embedded_services(ctx.settings, say):
        result = run(
            ctx.settings,
            events=events,
            keys=keys,
            latency_rate=latency_rate,
            latency_seconds=latency_seconds,
            out_dir=out_dir,
            overrides=ctx.overrides,
            measure=chosen,
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


@click.command("count-scale")
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
def count_scale(
    ctx: Context,
    keys: int,
    rate: int,
    seconds: float,
    speedup: int,
    driver_memory: str,
    out_dir: Path,
) -> None:
    """Many distinct keys in 1-minute windows: state held, memory, over time."""
    from kappaflow_bench.scale import run_scale

    with svc.embedded_services(ctx.settings, say):
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


COMMANDS = (count, count_scale)
