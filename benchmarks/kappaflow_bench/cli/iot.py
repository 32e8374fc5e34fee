"""The IoT application's benchmarks: ``iot-models``, its anomaly models compared on
labelled series; ``iot-ingest``, its ingestion paths' readings per second and response
time; ``iot-latency``, the whole application's sustained rate and end-to-end latency."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kappaflow import services as svc
from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import say, table
from kappaflow_bench.cli.options import rates


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
                    "-" if v["false_row_share"] is None else f"{v['false_row_share']:.3%}",
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
            "normal rows flagged",
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


def _batches(_ctx: click.Context, _param: click.Parameter, value: str) -> list[int]:
    try:
        found = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a list of whole numbers") from None
    # The gateway's largest batch (kappaflow.iot.gateway.MAX_BATCH).
    if not found or any(not 1 <= b <= 5_000 for b in found):
        raise click.BadParameter(f"{value!r}: each batch is 1 to 5,000 readings")
    return found


@click.command("iot-ingest")
@click.option(
    "--devices",
    default=16,
    show_default=True,
    type=click.IntRange(min=1, max=1_000),
    help="devices sending at once, each its own connection",
)
@click.option(
    "--batches",
    default="1,50",
    show_default=True,
    callback=_batches,
    help="readings per request (per burst of MQTT messages), comma-separated",
)
@click.option(
    "--duration",
    default=20.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="seconds measured per path and batch",
)
@click.option(
    "--warmup",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="seconds sent before each measurement",
)
@click.option(
    "--mqtt-in-flight",
    default=1_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="MQTT readings sent and not in Kafka yet beyond which devices wait (the broker "
    "acknowledges before the bridge); at least DEVICES x batch",
)
@click.option(
    "--out",
    "out_dir",
    default="bench-results/iot-ingest",
    show_default=True,
    type=click.Path(path_type=Path),
)
@pass_context
def iot_ingest(
    ctx: Context,
    devices: int,
    batches: list[int],
    duration: float,
    warmup: float,
    mqtt_in_flight: int,
    out_dir: Path,
) -> None:
    """Readings per second and response time of the IoT application's ingestion paths
    (the HTTP gateway; MQTT through the bridge) beside a direct Kafka producer (acks=all,
    idempotent), measured in the same run: DEVICES devices, each sending a batch and
    waiting for its acknowledgement, at each batch size. The gateway and the bridge run
    as processes of their own, on the embedded services."""
    from kappaflow_bench.iot_ingest import COLUMNS, rows, run

    settings = ctx.settings
    # The gateway's and the bridge's settings: this command's own.
    flags = ["--state-dir", str(settings.state_dir.resolve())]
    if ctx.config_file is not None:
        flags += ["--config", str(ctx.config_file.resolve())]
    if ctx.overrides.bootstrap_servers is not None:
        flags += ["--bootstrap-servers", ctx.overrides.bootstrap_servers]
    with svc.embedded_services(settings, say):
        result = run(
            settings,
            flags,
            devices=devices,
            batches=batches,
            warmup_s=warmup,
            duration_s=duration,
            mqtt_in_flight=mqtt_in_flight,
            out_dir=out_dir,
            say=say,
        )
    table(
        f"IoT ingestion: {devices} devices, {duration:g} s per path and batch",
        COLUMNS,
        rows(result),
    )
    say(f"wrote {out_dir / 'result.json'} and {out_dir / 'summary.md'}")


@click.command("iot-latency")
@click.option(
    "--devices",
    default=200,
    show_default=True,
    type=click.IntRange(min=1),
    help="simulated devices; each sends its six metrics in turn",
)
@click.option(
    "--rates",
    default="250",
    show_default=True,
    callback=rates("readings"),
    help="readings per second of the whole fleet, comma-separated: one window each, "
    "lowest first (a rate the machine does not sustain leaves a backlog to the next)",
)
@click.option(
    "--duration",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=5.0),
    help="seconds measured per window",
)
@click.option(
    "--warmup",
    default=90.0,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="seconds sent before the first window, and then until 95%% of the series have a "
    "model that has learnt its 30 readings (one that has not scores 0)",
)
@click.option(
    "--settle",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="seconds sent after the trainer stops or the rate changes, before a window",
)
@click.option("--seed", default=11, show_default=True, type=int)
@click.option(
    "--scorers",
    default="realtime,batch",
    show_default=True,
    help="the scorers to measure, one whole run each, in this order: realtime (the "
    "real-time scorer, a job of its own) and batch (the micro-batch scoring part)",
)
@click.option(
    "--alerts",
    "placements",
    default="app",
    show_default=True,
    help="where the alerting part runs, comma-separated, one whole run each per scorer: "
    "app (in the application job, beside cleaning and device state), apart (a job of "
    "its own) and realtime (the score rule in real-time mode, a job of its own: "
    "kappaflow.iot.alerts:build_realtime); a run with alerts apart is written to "
    "OUT/SCORER-alerts-apart/, with alerts realtime to OUT/SCORER-alerts-realtime/",
)
@click.option(
    "--out",
    "out_dir",
    default="bench-results/iot-latency",
    show_default=True,
    type=click.Path(path_type=Path),
)
@pass_context
def iot_latency(
    ctx: Context,
    devices: int,
    rates: list[float],
    duration: float,
    warmup: float,
    settle: float,
    seed: int,
    scorers: str,
    placements: str,
    out_dir: Path,
) -> None:
    """The IoT application's sustained readings per second and end-to-end latency on
    this machine: the simulator's fleet sent straight to Kafka at each rate, through
    cleaning, scoring and alerting (one job) with the trainer as a job of its own; each
    rate measured with the trainer running, then again with it stopped. Latency is from
    a reading's event time to its score in `scores` and to its alert in `alerts`. Each
    scorer is a run of its own, one after the other, written to OUT/SCORER/."""
    from kappaflow_bench.iot_latency import COLUMNS, LatencyBenchResult, rows
    from kappaflow_bench.iot_latency_run import ALERTS, SCORERS, run

    chosen = _among(scorers, SCORERS, "--scorers")
    places = _among(placements, ALERTS, "--alerts")
    results: dict[tuple[str, str], LatencyBenchResult] = {}
    with svc.embedded_services(ctx.settings, say):
        for scorer in chosen:
            for alerts in places:
                label = scorer if alerts == "app" else f"{scorer}-alerts-{alerts}"
                say(f"scorer {scorer}, alerts {alerts}")
                results[scorer, alerts] = result = run(
                    ctx.settings,
                    ctx.overrides,
                    ctx.config_file,
                    devices=devices,
                    rates=rates,
                    warmup_s=warmup,
                    settle_s=settle,
                    duration_s=duration,
                    seed=seed,
                    out_dir=out_dir / label,
                    say=say,
                    scorer=scorer,
                    alerts=alerts,
                )
                title = f"IoT application, {label}: {devices} devices, {duration:g} s a window"
                table(title, COLUMNS, rows(result))
                for ratio in result.ratios:
                    shown = ", ".join(
                        f"{k} {v}" for k, v in ratio.items() if k != "rate" and v is not None
                    )
                    say(f"trainer stopped / running at {ratio['rate']:,.0f}/s: {shown}")
                say(f"wrote {out_dir / label}/result.json, summary.md, timeline.csv")
    pairs = [
        (f"realtime / batch, alerts {a}", results.get(("realtime", a)), results.get(("batch", a)))
        for a in places
    ] + [
        (f"alerts apart / app, {s}", results.get((s, "apart")), results.get((s, "app")))
        for s in chosen
    ]
    for name, ours_run, theirs_run in pairs:
        if ours_run is None or theirs_run is None:
            continue
        for ours, theirs in zip(ours_run.windows, theirs_run.windows, strict=True):
            figures = [
                f"{figure} {a / b:.3g}"
                for figure, a, b in (
                    ("score p50", ours.to_score_p50_ms, theirs.to_score_p50_ms),
                    ("score p99", ours.to_score_p99_ms, theirs.to_score_p99_ms),
                    ("alert p50", ours.to_alert_p50_ms, theirs.to_alert_p50_ms),
                    ("alert p99", ours.to_alert_p99_ms, theirs.to_alert_p99_ms),
                )
                if a is not None and b
            ]
            say(f"{name}, {ours.phase} at {ours.rate:,.0f}/s: {', '.join(figures)}")


def _among(text: str, allowed: tuple[str, ...], option: str) -> list[str]:
    """The comma-separated names of ``text``, each one of ``allowed``."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or any(name not in allowed for name in names):
        raise click.BadParameter(f"choose among {', '.join(allowed)}", param_hint=option)
    return names


@click.command("iot-anomaly")
@click.option(
    "--data",
    default="data/anomaly",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="the development and held-out series (made there first where missing)",
)
@click.option(
    "--out",
    "out_file",
    default="data/anomaly/results.json",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
)
@click.option("--models", default="likelihood,forecast,robust", show_default=True)
@click.option("--batch", default=512, show_default=True, type=click.IntRange(min=1))
def iot_anomaly(data: Path, out_file: Path, models: str, batch: int) -> None:
    """The anomaly models on the repository's own labelled series (a development set and
    a held-out set), scored by the NAB rules in their three profiles at the alert score,
    beside a rolling z-score whose window and threshold are the development set's best."""
    from kappaflow.iot.models import MODELS
    from kappaflow.iot.nab import PROFILES
    from kappaflow_bench.anomaly_eval import run

    result = run(data, out_file, _among(models, tuple(sorted(MODELS)), "--models"), batch)
    rows: list[list[object]] = []
    named = [(m, e) for m, e in result["models"].items()]
    named.append(("zscore", result["zscore"]))
    for model, entry in named:
        for part in ("dev", "holdout"):
            figures = entry[part]
            rows.append(
                [
                    model,
                    part,
                    f"{figures['found']}/{figures['windows']}",
                    figures["false_positives"],
                    *(figures[p.name] for p in PROFILES),
                ]
            )
    table(
        "NAB scores at the alert score",
        ["model", "set", "found", "false positives", *(p.name for p in PROFILES)],
        rows,
    )
    zscore = result["zscore"]
    say(f"zscore: window {zscore['window']}, z >= {zscore['threshold']:g} (the dev set's best)")
    say(f"written to {out_file}")


@click.command("iot-scorer-cost")
@click.option(
    "--data",
    default="data/anomaly/dev",
    show_default=True,
    type=click.Path(path_type=Path, exists=True, file_okay=False),
)
@click.option(
    "--jar",
    "jars",
    multiple=True,
    help="LABEL=PATH of a kappaflow-iot.jar to time (repeat to compare; default: setup's)",
)
@click.option(
    "--python-src",
    "sources",
    multiple=True,
    help="LABEL=DIR of a kappaflow source tree (its src folder) to time the Python model "
    "from (repeat to compare; default: the installed one)",
)
@click.option("--batch", default=512, show_default=True, type=click.IntRange(min=1))
@click.option("--passes", default=3, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--out",
    "out_dir",
    default="bench-results/iot-scorer-cost",
    show_default=True,
    type=click.Path(path_type=Path),
)
@pass_context
def iot_scorer_cost(
    ctx: Context,
    data: Path,
    jars: tuple[str, ...],
    sources: tuple[str, ...],
    batch: int,
    passes: int,
    out_dir: Path,
) -> None:
    """The likelihood model's cost per reading: the JVM real-time scorer's (µs a reading
    scored) and the Python trainer's and scorer's, on DATA's series, replayed in rounds."""
    from kappaflow.iot.jvm.scorer import scorer_jar
    from kappaflow_bench.iot_scorer_cost import run

    if not jars:
        jar = scorer_jar(ctx.settings)
        if jar is None:
            raise click.ClickException("no kappaflow-iot.jar: run kappaflow setup")
        jars = (f"current={jar}",)
    if not sources:
        import kappaflow

        sources = (f"current={Path(kappaflow.__file__).parent.parent}",)
    result = run(data, out_dir, jars, sources, batch, passes)
    rows: list[list[object]] = [
        [f"jvm {label}", "score", *(f"{v:.2f}" for v in runs)]
        for label, runs in result["jvm_us_per_reading"].items()
    ]
    for label, runs in result["python"].items():
        rows.append([f"python {label}", "train", *(f"{r['train_us']:.2f}" for r in runs)])
        rows.append([f"python {label}", "score", *(f"{r['score_us']:.2f}" for r in runs)])
    table(
        f"µs a reading, {result['readings']:,} readings",
        ["code", "part", *(f"pass {i + 1}" for i in range(passes))],
        rows,
    )
    say(f"wrote {out_dir / 'result.json'}")


COMMANDS = (iot_models, iot_corpus, iot_ingest, iot_latency, iot_anomaly, iot_scorer_cost)
