"""``iot-models``: the IoT application's anomaly models compared on labelled series."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import say, table


@click.command("iot-models")
@click.option("--devices", default=10, show_default=True, type=click.IntRange(min=1))
@click.option("--days", default=3.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option("--seed", default=3, show_default=True, type=int)
@click.option(
    "--batch",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    help="readings per training micro-batch",
)
@click.option(
    "--out",
    "out_dir",
    default="bench-results/iot-models",
    show_default=True,
    type=click.Path(path_type=Path),
)
@pass_context
def iot_models(
    ctx: Context, devices: int, days: float, seed: int, batch: int, out_dir: Path
) -> None:
    """Each anomaly model on the simulator's labelled fleet (DEVICES x six metrics, one
    reading a minute, DAYS days) and on the labelled series shipped in aeon's wheel:
    precision, recall and F1 per incident, median delay and a Numenta-style score."""
    from kappaflow_bench.iot_models import run

    path = run(out_dir, ctx.settings.state_dir / "cache" / "iot-models", devices, days, seed, batch)
    result = json.loads(path.read_text())
    rows: list[list[object]] = []
    for scored in result["results"]:
        for threshold in ("0.5", "0.7"):
            v = scored["by_threshold"][threshold]
            rows.append(
                [
                    scored["corpus"],
                    scored["model"],
                    threshold,
                    f"{v['found']}/{v['incidents']}",
                    v["false_alarms"],
                    f"{v['precision']:.2f}",
                    f"{v['recall']:.2f}",
                    f"{v['f1']:.2f}",
                    v["median_delay_rows"],
                    f"{v['nab_score']:.1f}",
                    f"{scored['rows'] / scored['seconds']:,.0f}/s",
                ]
            )
    table(
        "IoT anomaly models",
        [
            "corpus",
            "model",
            "score >=",
            "found",
            "false alarms",
            "precision",
            "recall",
            "F1",
            "median delay (rows)",
            "NAB-style",
            "rows/s",
        ],
        rows,
    )
    say(f"wrote {path}")


@click.command("iot-corpus")
@click.option("--devices", default=10, show_default=True, type=click.IntRange(min=1))
@click.option("--days", default=3.0, show_default=True, type=click.FloatRange(min=0.01))
@click.option("--seed", default=3, show_default=True, type=int)
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path))
def iot_corpus(devices: int, days: float, seed: int, out_dir: Path) -> None:
    """Write the simulator's labelled series (DEVICES x six metrics, one reading a minute,
    DAYS days) as CSV files timestamp,value,is_anomaly, for kappaflow iot evaluate."""
    from datetime import UTC, datetime

    from kappaflow.iot.corpus import simulated_corpus
    from kappaflow.iot.simulator import FleetConfig

    config = FleetConfig(devices=devices, rate=devices * 6 / 60.0, seed=seed)
    files = simulated_corpus(out_dir, config, datetime(2026, 2, 1, tzinfo=UTC), days)
    say(f"wrote {len(files)} series under {out_dir}")


COMMANDS = (iot_models, iot_corpus)
