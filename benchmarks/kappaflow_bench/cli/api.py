"""``api``: what the job API costs against the built-in count job, on one backlog."""

from __future__ import annotations

from pathlib import Path

import click

from kappaflow import services as svc
from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import say, table


@click.command("api")
@click.option(
    "--events", default=1_000_000, show_default=True, type=click.IntRange(min=1), help="backlog"
)
@click.option(
    "--keys", default=10_000, show_default=True, type=click.IntRange(min=1), help="distinct keys"
)
@click.option(
    "--repeat",
    default=2,
    show_default=True,
    type=click.IntRange(min=1),
    help="rounds of the three variants, interleaved",
)
@click.option(
    "--out",
    "out_dir",
    default="bench-results/api",
    show_default=True,
    type=click.Path(path_type=Path),
)
@pass_context
def api(ctx: Context, events: int, keys: int, repeat: int, out_dir: Path) -> None:
    """The counting workload as a job on the job API (count; count, sum, mean and
    distinct ids) against the built-in count job, over one backlog, taking turns."""
    from kappaflow_bench.api import VARIANTS, run

    with svc.embedded_services(ctx.settings, say):
        result = run(
            ctx.settings,
            events=events,
            keys=keys,
            repeat=repeat,
            out_dir=out_dir,
            overrides=ctx.overrides,
        )
    rows: list[list[object]] = [
        [
            f"{r.variant} (round {r.round})",
            f"{r.rate:,.0f}/s",
            f"{r.seconds:.1f}s",
            r.batches,
            f"{r.load_average_at_start:.2f}",
        ]
        for r in result.runs
    ]
    rows += [
        [f"{variant}: median", f"{result.median_rate[variant]:,.0f}/s", "", "", ""]
        for variant in VARIANTS
    ]
    rows += [
        [f"{variant} / builtin", f"{result.ratio_to_builtin[variant]:.1%}", "", "", ""]
        for variant in VARIANTS
        if variant != "builtin"
    ]
    rows += [
        [f"{name} / builtin, per round", f"{ratio:.1%}", "", "", ""]
        for name, ratio in result.paired_ratio_median.items()
        if name != "builtin"
    ]
    table(
        f"job API benchmark: {result.events:,} events x {result.event_bytes} bytes, "
        f"{result.keys:,} keys",
        ["run", "events/s", "seconds", "batches", "load at start"],
        rows,
    )
    say(f"wrote {out_dir / 'result.json'}")


COMMANDS = (api,)
