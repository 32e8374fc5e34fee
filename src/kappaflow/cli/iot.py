"""``kappaflow iot``: the IoT telemetry application."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import click

from kappaflow.cli import iot_gateway
from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.data import TIME
from kappaflow.cli.output import json_line, say
from kappaflow.errors import CommandLineError
from kappaflow.iot.evaluation import (
    Series,
    Verdict,
    corpus,
    judge,
    read_series,
    replay,
    scores_name,
    write_scores,
)
from kappaflow.iot.feed import KafkaSink, LabelsFile, LinesSink, Sink, feed
from kappaflow.iot.models import ALERT_SCORE, EVALUATE_MODEL, MODELS
from kappaflow.iot.nab import Report, score_series
from kappaflow.iot.plots import plot_name, write_plot
from kappaflow.iot.simulator import FleetConfig, Simulation
from kappaflow.iot.telemetry import EVENTS_TOPIC, READINGS_TOPIC
from kappaflow.kafka.topics import DEFAULT_PARTITIONS
from kappaflow.timeutil import parse_duration

#: How far the clock moves per step: live, how often records leave; backfilling, how many
#: go to the producer at once.
_LIVE_STEP_S = 0.2
_BACKFILL_STEP_S = 10.0


@click.group()
def iot() -> None:
    """The IoT telemetry application: devices, their readings and alerts."""


@iot.command()
@click.option("--devices", type=click.IntRange(1, 1_000_000), default=1_000, show_default=True)
@click.option(
    "--rate",
    type=click.FloatRange(min=0.001),
    default=1_000.0,
    show_default=True,
    help="readings a second, whole fleet (each device samples its six metrics in turn)",
)
@click.option(
    "--duration", metavar="DURATION", help="simulated time to run (10m, 2h) [default: until Ctrl-C]"
)
@click.option(
    "--start",
    type=TIME,
    help="backfill: run the clock from this time as fast as possible (needs --duration)",
)
@click.option("--seed", type=int, default=1, show_default=True, help="the same seed, the same run")
@click.option(
    "--anomalies-per-day",
    type=click.FloatRange(min=0.0),
    default=1.0,
    show_default=True,
    help="labelled anomalies a day per device and metric",
)
@click.option(
    "--labels",
    type=click.Path(dir_okay=False, path_type=Path),
    help="the ground truth, JSON lines [default: <state_dir>/iot/labels.jsonl]",
)
@click.option(
    "--output",
    type=click.Choice(["kafka", "stdout"]),
    default="kafka",
    show_default=True,
    help="kafka: the readings and events topics; stdout: JSON lines {topic, key, value}",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=DEFAULT_PARTITIONS,
    show_default=True,
    help="partitions of the topics, if they are created",
)
@click.option("--readings-topic", default=READINGS_TOPIC, show_default=True)
@click.option("--events-topic", default=EVENTS_TOPIC, show_default=True)
@pass_context
def simulate(
    ctx: Context,
    devices: int,
    rate: float,
    duration: str | None,
    start: datetime | None,
    seed: int,
    anomalies_per_day: float,
    labels: Path | None,
    output: str,
    partitions: int,
    readings_topic: str,
    events_topic: str,
) -> None:
    """Run a fleet of devices sending telemetry, with faults and labelled anomalies.

    Readings go to the readings topic and heartbeats, commands and state changes to the
    events topic, keyed by device. Devices skew their clocks, send out of order and
    twice, and go silent; anomalies (spikes, level shifts, drifts, stuck sensors, changed
    variance, dropouts) are written to the labels file as they begin. Prints what was
    sent, as one JSON line, when it ends.
    """
    run_s = parse_duration(duration).total_seconds() if duration is not None else None
    if start is not None and run_s is None:
        raise CommandLineError("--start backfills a span of time: give --duration too")
    config = FleetConfig(devices=devices, rate=rate, seed=seed, anomalies_per_day=anomalies_per_day)
    begin = start.timestamp() if start is not None else time.time()
    simulation = Simulation(config, begin)
    truth = LabelsFile(labels or ctx.settings.state_dir / "iot" / "labels.jsonl")
    sink: Sink = (
        KafkaSink(
            ctx.settings.kafka,
            partitions=partitions,
            topics={READINGS_TOPIC: readings_topic, EVENTS_TOPIC: events_topic},
        )
        if output == "kafka"
        else LinesSink(sys.stdout)
    )
    live = start is None
    stop = threading.Event()
    try:
        tally = feed(
            simulation,
            sink,
            truth,
            until=begin + run_s if run_s is not None else None,
            live=live,
            stop=stop,
            step_s=_LIVE_STEP_S if live else _BACKFILL_STEP_S,
        )
    except KeyboardInterrupt:
        # What was produced is flushed (feed closes the sink); Ctrl-C ends a live run.
        tally = simulation.tally
    summary = {**tally.to_json(), "labels": str(truth.path)}
    if output == "kafka":
        json_line(summary)
    else:
        # Standard output carries the records: the summary goes to standard error.
        say(json.dumps(summary))


@iot.command()
@click.option(
    "--input",
    "input_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="a folder of CSV series (timestamp,value), searched recursively",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="where each series' scores go, at the same relative path",
)
@click.option(
    "--model",
    type=click.Choice(sorted(MODELS)),
    default=EVALUATE_MODEL,
    show_default=True,
    help="the anomaly model trained and scored with",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="rows of each series per round, after rounds of 16, 32, ... rows: each round is "
    "scored with the model learnt from the rounds before",
)
@click.option(
    "--path",
    "route",
    type=click.Choice(["kafka", "local"]),
    default="kafka",
    show_default=True,
    help="kafka: through Kafka, the training job, the models topic and the scoring job, "
    "as live readings go; local: the same trainer and scorer in this process",
)
@click.option(
    "--plot",
    is_flag=True,
    help="also draw each series as a PNG beside its scores: the values with the labelled "
    "anomalies' windows and the alarms, and the scores with the alert score (needs "
    "matplotlib: pip install 'kappaflow[plot]')",
)
@pass_context
def evaluate(
    ctx: Context, input_dir: Path, out_dir: Path, model: str, batch: int, route: str, plot: bool
) -> None:
    """Score recorded series as the application scores a device's metric.

    Every CSV file under --input (header timestamp,value; timestamps such as
    2014-04-01 00:00:00, read as UTC) is one series, replayed as one device's metric.
    Its readings go in rounds of --batch to the scoring job, then to the training job,
    and each is scored with the model learnt from the rounds before its own (with
    --path local, the same trainer and scorer run in this process, with the same
    scores). For each
    file, a CSV file timestamp,value,anomaly_score with one row per input row, in the
    same order, is written at the same relative path under --out. Where the input has an
    is_anomaly (or label) column, the detections at the alert score are judged against
    it, and scored by the Numenta Anomaly Benchmark's rules (windows around each labelled
    anomaly, its three profiles: see kappaflow.iot.nab). Prints one JSON line: files,
    rows, seconds, the judgement and the NAB scores. With --plot, a picture of each series
    (name.png beside name.csv): its values, the labelled anomalies' windows, the alarms at
    the alert score, and its scores.
    """
    files = corpus(input_dir)
    if not files:
        raise CommandLineError(f"{input_dir} holds no .csv file")
    began = time.perf_counter()
    series = {path.relative_to(input_dir).as_posix(): read_series(path) for path in files}
    if route == "local":
        scores = {name: replay(s.values, MODELS[model], batch) for name, s in series.items()}
    else:
        scores = _through_kafka(ctx, series, model, batch)
    rows = 0
    verdict = Verdict()
    nab = Report()
    labelled = 0
    for name, s in series.items():
        write_scores(out_dir / scores_name(name), s, scores[name])
        if plot:
            title = f"{name}: {model}, alert score {ALERT_SCORE}"
            write_plot(out_dir / plot_name(name), title, s, scores[name], ALERT_SCORE)
        rows += len(s.values)
        if s.labels is not None:
            labelled += 1
            verdict.add(judge(scores[name], s.labels))
            nab.add(score_series(scores[name], s.labels, ALERT_SCORE))
    summary: dict[str, object] = {
        "files": len(files),
        "rows": rows,
        "seconds": round(time.perf_counter() - began, 2),
        "model": model,
        "path": route,
        "batch": batch,
        "out": str(out_dir),
    }
    if plot:
        summary["plots"] = len(series)
    if labelled:
        summary["labelled_files"] = labelled
        summary["judgement"] = {"threshold": ALERT_SCORE, **verdict.to_json()}
        summary["nab"] = {"threshold": ALERT_SCORE, **nab.to_json()}
    json_line(summary)


def _through_kafka(
    ctx: Context, series: dict[str, Series], model: str, batch: int
) -> dict[str, list[float]]:
    from kappaflow import services as svc
    from kappaflow.iot.replay import replay_through_kafka
    from kappaflow.spark.session import build_session

    def progress(done: int, rounds: int) -> None:
        if done == rounds or done % 10 == 0:
            say(f"round {done} of {rounds}")

    # The jobs log each micro-batch on standard output; this command's output is its
    # JSON line alone.
    with svc.embedded_services(ctx.settings, say), contextlib.redirect_stdout(sys.stderr):
        spark = build_session(ctx.settings, "kappaflow-iot-evaluate")
        try:
            return replay_through_kafka(
                ctx.settings, spark, series, model=model, batch=batch, progress=progress
            )
        finally:
            spark.stop()


for _command in iot_gateway.COMMANDS:
    iot.add_command(_command)

COMMANDS = (iot,)
# `iot bridge`, the MQTT bridge's command, lives in a module of its own.
iot.add_command(__import__("kappaflow.cli.iot_mqtt", fromlist=["_"]).bridge_command)
