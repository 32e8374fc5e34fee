"""``nexmark``: Nexmark's queries on kappaflow's job API and on Flink SQL, side by side."""

from __future__ import annotations

from pathlib import Path

import click

from kappaflow import services as svc
from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import say, table
from kappaflow.errors import CommandLineError, KappaflowError
from kappaflow.kafka.topics import DEFAULT_PARTITIONS


@click.command("nexmark")
@click.option(
    "--events",
    default=1_000_000,
    show_default=True,
    type=click.IntRange(min=50),
    help="generated, people, auctions and bids 1:3:46",
)
@click.option(
    "--queries",
    default="q0,q1,q2,q3,q5,q7,q8",
    show_default=True,
    help="comma-separated; each runs alone on each engine",
)
@click.option(
    "--engines",
    default="kappaflow,flink",
    show_default=True,
    help="kappaflow, flink or both",
)
@click.option("--seed", default=1, show_default=True, type=int, help="of the generator")
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=DEFAULT_PARTITIONS,
    show_default="this machine's cores",
    help="of each of the three topics",
)
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path, file_okay=False))
@pass_context
def nexmark(
    ctx: Context,
    events: int,
    queries: str,
    engines: str,
    seed: int,
    partitions: int,
    out_dir: Path,
) -> None:
    """Nexmark: generate the auction model into Kafka, run each query on kappaflow's job
    API and on Flink SQL over the same events, check that their results agree, and
    report throughput per core and kappaflow's over Flink's."""
    from kappaflow_bench.nexmark.bench import parse_queries, run

    names = parse_queries(queries)
    chosen = tuple(e.strip() for e in engines.split(",") if e.strip())
    if not chosen or any(e not in ("kappaflow", "flink") for e in chosen):
        raise CommandLineError(f"--engines {engines!r}: kappaflow, flink or both")
    with svc.embedded_services(ctx.settings, say):
        result = run(
            ctx.settings,
            events=events,
            queries=names,
            seed=seed,
            partitions=partitions,
            engines=chosen,
            out_dir=out_dir,
            overrides=ctx.overrides,
            say=say,
        )

    def figure(run: dict[str, object], key: str) -> str:
        value = run.get(key)
        return f"{value:,}" if isinstance(value, int | float) else "-"

    rows = [
        [
            q.query,
            f"{q.events:,}",
            *(figure(q.engines.get(e, {}), "events_per_core_s") for e in ("kappaflow", "flink")),
            "-" if q.ratio is None else f"{q.ratio:.3f}",
            "-" if not q.agreement else ("yes" if q.agreement["agree"] else "NO"),
        ]
        for q in result.queries
    ]
    columns = ["query", "events", "kappaflow ev/core/s", "flink ev/core/s", "kf/flink", "agree"]
    table(f"Nexmark, {events:,} events, {result.cores} cores", columns, rows)
    if result.geomean_ratio is not None:
        say(f"geometric mean of kappaflow over Flink: {result.geomean_ratio:.3f}")
    for query, why in result.skipped.items():
        say(f"{query} not run on kappaflow: {why}")
    say(f"wrote {out_dir}/result.json")
    if any(q.agreement and not q.agreement["agree"] for q in result.queries):
        raise KappaflowError(f"the engines' results differ (see {out_dir / 'result.json'})")


COMMANDS = (nexmark,)
