"""``scale-out``: one job's backlog on one worker and on two, and the driver's share."""

from __future__ import annotations

from pathlib import Path

import click

from kappaflow import services as svc
from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import say, table


@click.command("scale-out")
@click.option(
    "--events", default=1_000_000, show_default=True, type=click.IntRange(min=1), help="backlog"
)
@click.option(
    "--keys", default=10_000, show_default=True, type=click.IntRange(min=1), help="distinct keys"
)
@click.option(
    "--workers",
    default="1,2",
    show_default=True,
    help="worker counts to compare, comma-separated",
)
@click.option(
    "--cores", default=1, show_default=True, type=click.IntRange(min=1), help="cores per worker"
)
@click.option("--executor-memory", default="2g", show_default=True, help="memory per worker")
@click.option(
    "--repeat", default=2, show_default=True, type=click.IntRange(min=1), help="rounds, alternated"
)
@click.option(
    "--out",
    "out_dir",
    default="bench-results/scale-out",
    show_default=True,
    type=click.Path(path_type=Path),
)
@pass_context
def scale_out(
    ctx: Context,
    events: int,
    keys: int,
    workers: str,
    cores: int,
    executor_memory: str,
    repeat: int,
    out_dir: Path,
) -> None:
    """A job's backlog on a standalone cluster of one worker, then of two (small and
    large outputs), with the driver's CPU and memory for each."""
    from kappaflow_bench.scale_out import run

    try:
        counts = tuple(sorted({int(n) for n in workers.split(",")}))
    except ValueError:
        raise click.BadParameter(
            f"not a list of numbers: {workers!r}", param_hint="--workers"
        ) from None
    if len(counts) < 2 or counts[0] < 1:
        raise click.BadParameter(
            "give two worker counts or more, each 1 or above", param_hint="--workers"
        )
    with svc.embedded_services(ctx.settings, say):
        result = run(
            ctx.settings,
            events=events,
            keys=keys,
            workers=counts,
            cores=cores,
            executor_memory=executor_memory,
            repeat=repeat,
            out_dir=out_dir,
            overrides=ctx.overrides,
        )
    rows: list[list[object]] = [
        [
            f"{r.job}, {r.workers} worker(s), round {r.round}",
            f"{r.rate:,.0f}/s",
            f"{r.seconds:.1f}s",
            f"{r.driver_cpu_s:.1f}",
            f"{r.driver_peak_rss_mb:,.0f}",
        ]
        for r in result.runs
    ]
    rows += [
        [f"{job}: {counts[-1]} / {counts[0]} workers", f"{ratio:.2f}x", "", "", ""]
        for job, ratio in result.speedup.items()
    ]
    table(
        f"scale-out: {result.events:,} events, {cores} core(s) per worker",
        ["run", "events/s", "seconds", "driver cpu-s", "driver peak MB"],
        rows,
    )
    say(f"wrote {out_dir / 'result.json'}")


COMMANDS = (scale_out,)
