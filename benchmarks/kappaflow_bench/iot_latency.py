"""The IoT application's sustained rate and end-to-end latency on one machine: what a
run measures (the reader of the outputs, the CPU accounting, the figures) and its
report. The run itself is in ``iot_latency_run``.

A fleet's readings go straight to the raw topic at a steady rate; the application runs
as two jobs: cleaning, scoring, alerting and device state in one, the trainer in
another. For each rate, a window is measured with the trainer running, then the trainer
is stopped and each rate is measured again. Per window:

- readings per second sent (acknowledged by Kafka) and scored (records appended to the
  ``scores`` topic), and the backlog (readings acknowledged and not yet scored) at the
  window's start and end: a rate is sustained when the backlog does not grow;
- from a reading's event time (its send time) to its score's append to ``scores``, and
  to its alert's append to ``alerts`` (the alert's ``time`` is the event time of the
  reading that raised it), p50 and p99 of the readings sent in the window: the topics
  stamp records with the broker's clock (``LogAppendTime``), on the machine whose clock
  stamped the readings. The same from event time to the moment a ``read_committed``
  consumer had the record, since the job's records are published in one transaction per
  micro-batch and a reader sees them at its commit;
- the model updates published, the share of scores made with a model, and the series
  whose model version moved within the window: with the trainer stopped, scoring goes on
  with versions that no longer change;
- CPU seconds per wall second of the generator (the benchmark's own process: the
  simulator, its producer), the reader of the outputs (a process of its own), each job's
  driver with its JVM and Python workers, Kafka and Redis, and the whole machine;
- each query's micro-batches (count, p50 and largest duration), from its driver's log.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil
from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, TopicPartition

from kappaflow.iot.models import ALERT_SCORE
from kappaflow.iot.models.base import WARMUP
from kappaflow.kafka.clients import consumer
from kappaflow.settings import KafkaSettings
from kappaflow_bench.report import percentile

PHASES = ("trainer running", "trainer stopped")
#: A finished micro-batch, as a job's driver logs it (``kappaflow.jobs.runner``).
_PROGRESS = re.compile(r"^progress (\S+) batch (\d+): (\d+) rows; ms ?([^;]*)")
#: The share of the series whose models must have learnt their ``WARMUP`` readings
#: before a window is measured.
MATURE_SHARE = 0.95
#: Alerts raised by a timer (no reading for a while) come when the watermark passes,
#: a minute behind the newest reading: not a reading's latency, counted apart.
TIMER_RULES = ("no_data",)

Ints = npt.NDArray[np.int64]


@dataclass
class Snapshot:
    """The run at one moment: the wall clock (epoch ms), readings acknowledged so far,
    CPU seconds per process (keyed by pid and start time, so that a process that came
    or went between two snapshots is counted for its time in between), the machine's
    CPU times, and how many lines each job's driver log had."""

    wall_ms: int
    acked: int
    cpu: dict[str, dict[tuple[int, float], float]]
    machine: Any  # psutil.cpu_times()
    log_lines: dict[str, int]


@dataclass
class Window:
    phase: str
    #: The readings per second the generator was asked for.
    rate: float
    seconds: float = 0.0
    #: Readings acknowledged by Kafka in the window, and per second.
    sent: int = 0
    sent_rate: float = 0.0
    #: Score records appended to ``scores`` in the window, and per second.
    scored: int = 0
    scored_rate: float = 0.0
    #: Readings acknowledged and not yet scored, at the window's start and end.
    backlog_start: int = 0
    backlog_end: int = 0
    #: Readings sent in the window without a score by the end of the run (to within the
    #: few in flight at the window's edges).
    unscored: int = 0
    #: Event time → the score's append to ``scores``; → a reader had it.
    score_samples: int = 0
    to_score_p50_ms: float | None = None
    to_score_p99_ms: float | None = None
    to_score_max_ms: float | None = None
    to_score_read_p50_ms: float | None = None
    to_score_read_p99_ms: float | None = None
    #: Alert records of readings sent in the window, by "rule status".
    alerts: dict[str, int] = field(default_factory=dict)
    #: Event time → the alert's append to ``alerts``, for alerts raised by a reading.
    alert_samples: int = 0
    to_alert_p50_ms: float | None = None
    to_alert_p99_ms: float | None = None
    to_alert_read_p50_ms: float | None = None
    to_alert_read_p99_ms: float | None = None
    #: Model updates appended to ``models`` in the window.
    model_updates: int = 0
    #: Of the window's scores: the share made with a model; the series scored, those
    #: whose model version moved within the window, and the newest version seen.
    with_model_share: float | None = None
    series: int = 0
    series_version_moved: int = 0
    newest_model_version: int | None = None
    #: CPU seconds per wall second, by process; the machine's (of its cores).
    cpu: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0
    #: Per job and query: micro-batches finished in the window, rows, p50 and largest
    #: duration (ms, from trigger to commit).
    batches: dict[str, dict[str, float]] = field(default_factory=dict)
    load_average_at_start: list[float] = field(default_factory=list)


@dataclass
class LatencyBenchResult:
    devices: int
    rates: list[float]
    warmup_s: float
    settle_s: float
    duration_s: float
    anomalies_per_day: float
    partitions: int
    #: ``realtime`` (``kappaflow.iot.realtime``, a job of its own) or ``batch`` (the
    #: application job's micro-batch scoring part).
    scorer: str = "batch"
    #: Where the alerting part runs: ``app`` (in the application job, beside cleaning and
    #: device state) or ``apart`` (a job, so a driver, of its own).
    alerts_in: str = "app"
    windows: list[Window] = field(default_factory=list)
    #: Per rate: the trainer-stopped window's figures over the trainer-running one's.
    ratios: list[dict[str, Any]] = field(default_factory=list)
    #: Mean bytes of a reading's JSON.
    reading_bytes: float = 0.0
    readings_sent: int = 0
    readings_scored: int = 0
    alerts: dict[str, int] = field(default_factory=dict)
    #: Seconds the trainer took to stop; the last model update's append after the stop
    #: was asked (negative: before).
    trainer_stop_s: float = 0.0
    last_model_update_after_stop_s: float | None = None
    #: Seconds from the first model update until ``MATURE_SHARE`` of the series had a
    #: model that has learnt its ``WARMUP`` readings (a model short of them scores 0).
    models_mature_s: float = 0.0
    #: Scores at or above the alerting job's ``ALERT_SCORE``, over the whole run.
    scores_high: int = 0
    #: Seconds from the generator's stop until every reading had its score (or the
    #: wait's end).
    drain_s: float = 0.0
    generator: dict[str, Any] = field(default_factory=dict)
    jobs: dict[str, Any] = field(default_factory=dict)
    uptime_at_start: str = ""
    uptime_at_end: str = ""
    machine: dict[str, Any] = field(default_factory=dict)


# The reader of the outputs, in a process of its own: a CSV line a record, and back.


def _epoch_ms(text: str) -> int:
    found = datetime.fromisoformat(text)
    if found.tzinfo is None:
        found = found.replace(tzinfo=UTC)
    return round(found.timestamp() * 1000)


def watch(
    kafka: KafkaSettings, topics: tuple[str, str, str], path: str, stop: Any, seen: Any
) -> None:
    """Read ``scores``, ``alerts`` and ``models`` from their beginning until ``stop`` is
    set, a CSV line a record into ``path``; ``seen`` counts the records read of each, and
    then the series whose latest model has learnt ``WARMUP`` readings."""
    scores, alerts, models = topics
    # No long wait for a fuller fetch: a record is read within milliseconds of its commit.
    reader = consumer(kafka, **{"enable.partition.eof": False, "fetch.wait.max.ms": 20})
    assigned = []
    for topic in topics:
        partitions = reader.list_topics(topic, timeout=kafka.timeout_s).topics[topic].partitions
        assigned += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions]
    reader.assign(assigned)
    counts = [0, 0, 0, 0]
    #: The series whose latest model has learnt its WARMUP readings.
    mature: set[str] = set()
    try:
        with open(path, "w") as out:
            while not stop.is_set():
                messages = reader.consume(10_000, timeout=0.1)
                read_ms = int(time.time() * 1000)
                for m in messages:
                    if m.error() is not None:
                        continue
                    kind, log_ms = m.timestamp()
                    source = m.topic()
                    if source == models:
                        out.write(f"m,{log_ms},{read_ms}\n")
                        counts[2] += 1
                        update = json.loads(m.value() or b"{}")
                        key = f"{update['device']}/{update['metric']}"
                        if update["learnt"] >= WARMUP:
                            mature.add(key)
                        else:
                            mature.discard(key)
                        counts[3] = len(mature)
                        continue
                    if kind != TIMESTAMP_LOG_APPEND_TIME:
                        raise RuntimeError(f"{source!r} is not stamped with the log's clock")
                    v = json.loads(m.value() or b"{}")
                    event = _epoch_ms(v["time"])
                    if source == scores:
                        version = v.get("model_version")
                        version = "" if version is None else int(version)
                        series = f"{v['device']}/{v['metric']}"
                        score = float(v["score"])
                        out.write(f"s,{log_ms},{read_ms},{event},{version},{series},{score}\n")
                        counts[0] += 1
                    elif source == alerts:
                        out.write(f"a,{log_ms},{read_ms},{event},{v['rule']},{v['status']}\n")
                        counts[1] += 1
                seen[:] = counts
    finally:
        reader.close()


@dataclass
class Records:
    """Per output record: (log append, read, event time) in epoch ms."""

    #: Scores: log, read, event, model version (-1: none), series (an index).
    scores: Ints
    alerts: Ints
    #: Each alert's "rule status".
    alert_kinds: list[str]
    #: Model updates' log append times.
    models: Ints
    #: Scores at or above ``ALERT_SCORE``.
    high: int = 0


def read_records(path: Path) -> Records:
    scores: list[tuple[int, int, int, int, int]] = []
    alerts: list[tuple[int, int, int]] = []
    kinds: list[str] = []
    models: list[int] = []
    series: dict[str, int] = {}
    high = 0
    with path.open(newline="") as lines:
        for row in csv.reader(lines):
            if row[0] == "s":
                high += float(row[6]) >= ALERT_SCORE
                version = int(row[4]) if row[4] else -1
                index = series.setdefault(row[5], len(series))
                scores.append((int(row[1]), int(row[2]), int(row[3]), version, index))
            elif row[0] == "a":
                alerts.append((int(row[1]), int(row[2]), int(row[3])))
                kinds.append(f"{row[4]} {row[5]}")
            elif row[0] == "m":
                models.append(int(row[1]))
    return Records(
        scores=np.array(scores, dtype=np.int64).reshape(-1, 5),
        alerts=np.array(alerts, dtype=np.int64).reshape(-1, 3),
        alert_kinds=kinds,
        models=np.array(models, dtype=np.int64),
        high=high,
    )


# CPU.


def process_tree(pid: int | None, *, children: bool = True) -> list[psutil.Process]:
    if pid is None:
        return []
    try:
        root = psutil.Process(pid)
        return [root, *(root.children(recursive=True) if children else [])]
    except psutil.Error:
        return []


def cpu_seconds(processes: list[psutil.Process]) -> dict[tuple[int, float], float]:
    """Each process's own CPU seconds (a process's reaped children's are left out: a
    child that came and went within a window is not counted, none twice)."""
    found = {}
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            found[(proc.pid, proc.create_time())] = times.user + times.system
    return found


# The figures.


def _p(values: Ints, q: float) -> float | None:
    found = percentile(values.tolist(), q)
    return None if found is None else float(found)


def _cpu_delta(
    first: dict[tuple[int, float], float], last: dict[tuple[int, float], float]
) -> float:
    return sum(seconds - first.get(key, 0.0) for key, seconds in last.items())


def fill(
    window: Window, first: Snapshot, last: Snapshot, records: Records, logs: dict[str, list[str]]
) -> None:
    """``window``'s figures from the snapshots at its ends and what the outputs got."""
    start, end = first.wall_ms, last.wall_ms
    seconds = window.seconds = (end - start) / 1000
    window.sent = last.acked - first.acked
    window.sent_rate = round(window.sent / seconds, 1)
    s = records.scores
    s_log, s_read, s_event, s_version, s_series = s[:, 0], s[:, 1], s[:, 2], s[:, 3], s[:, 4]
    window.scored = int(((s_log >= start) & (s_log < end)).sum())
    window.scored_rate = round(window.scored / seconds, 1)
    window.backlog_start = first.acked - int((s_log < start).sum())
    window.backlog_end = last.acked - int((s_log < end).sum())
    mine = (s_event >= start) & (s_event < end)
    window.score_samples = int(mine.sum())
    window.unscored = max(0, window.sent - window.score_samples)
    to_log, to_read = (s_log - s_event)[mine], (s_read - s_event)[mine]
    window.to_score_p50_ms, window.to_score_p99_ms = _p(to_log, 50), _p(to_log, 99)
    window.to_score_max_ms = _p(to_log, 100)
    window.to_score_read_p50_ms, window.to_score_read_p99_ms = _p(to_read, 50), _p(to_read, 99)
    modelled = mine & (s_version >= 0)
    if window.score_samples:
        window.with_model_share = round(int(modelled.sum()) / window.score_samples, 4)
    versions: dict[int, tuple[int, int]] = {}
    for key, version in zip(s_series[modelled].tolist(), s_version[modelled].tolist(), strict=True):
        low, high = versions.get(key, (version, version))
        versions[key] = (min(low, version), max(high, version))
    window.series = len(np.unique(s_series[mine]))
    window.series_version_moved = sum(1 for low, high in versions.values() if high > low)
    window.newest_model_version = max((h for _, h in versions.values()), default=None)
    a = records.alerts
    a_mine = (a[:, 2] >= start) & (a[:, 2] < end)
    kinds = [k for k, m in zip(records.alert_kinds, a_mine.tolist(), strict=True) if m]
    window.alerts = dict(sorted(Counter(kinds).items()))
    raised = np.array(
        [k.endswith(" raised") and k.split()[0] not in TIMER_RULES for k in records.alert_kinds],
        dtype=bool,
    ).reshape(-1)
    timed = a_mine & raised
    window.alert_samples = int(timed.sum())
    to_log, to_read = (a[:, 0] - a[:, 2])[timed], (a[:, 1] - a[:, 2])[timed]
    window.to_alert_p50_ms, window.to_alert_p99_ms = _p(to_log, 50), _p(to_log, 99)
    window.to_alert_read_p50_ms, window.to_alert_read_p99_ms = _p(to_read, 50), _p(to_read, 99)
    window.model_updates = int(((records.models >= start) & (records.models < end)).sum())
    window.cpu = {
        name: round(_cpu_delta(first.cpu.get(name, {}), last.cpu[name]) / seconds, 3)
        for name in last.cpu
    }
    total = sum(last.machine) - sum(first.machine)
    idle = (last.machine.idle - first.machine.idle) + (last.machine.iowait - first.machine.iowait)
    cores = os.cpu_count() or 1
    window.machine_busy = round((total - idle) / total * cores, 3) if total else 0.0
    window.batches = {}
    for job, lines in logs.items():
        window.batches.update(
            _batches(job, lines[first.log_lines.get(job, 0) : last.log_lines.get(job, 0)])
        )


def _batches(job: str, lines: list[str]) -> dict[str, dict[str, float]]:
    """Per query of ``job``: the batches its driver logged in ``lines``."""
    found: dict[str, list[tuple[int, int]]] = {}
    for line in lines:
        match = _PROGRESS.match(line)
        if match is None:
            continue
        steps = {}
        for pair in match[4].split():
            step, _, ms = pair.partition("=")
            steps[step] = int(ms)
        found.setdefault(match[1], []).append((int(match[3]), steps.get("triggerExecution", 0)))
    summary: dict[str, dict[str, float]] = {}
    for query, batches in sorted(found.items()):
        durations = [ms for _, ms in batches]
        summary[f"{job}/{query}"] = {
            "batches": len(batches),
            "rows": sum(rows for rows, _ in batches),
            "p50_ms": float(percentile(durations, 50) or 0),
            "max_ms": float(max(durations)),
        }
    return summary


def ratios(windows: list[Window]) -> list[dict[str, Any]]:
    """Per rate: the trainer-stopped window's figures over the trainer-running one's."""
    found = []
    for running in (w for w in windows if w.phase == PHASES[0]):
        stopped = next(
            (w for w in windows if w.phase == PHASES[1] and w.rate == running.rate), None
        )
        if stopped is None:
            continue
        pairs = {
            "scored_rate": (stopped.scored_rate, running.scored_rate),
            "to_score_p50": (stopped.to_score_p50_ms, running.to_score_p50_ms),
            "to_score_p99": (stopped.to_score_p99_ms, running.to_score_p99_ms),
            "to_alert_p50": (stopped.to_alert_p50_ms, running.to_alert_p50_ms),
            "to_alert_p99": (stopped.to_alert_p99_ms, running.to_alert_p99_ms),
            "app_cpu": (stopped.cpu.get("app job"), running.cpu.get("app job")),
            "machine_busy": (stopped.machine_busy, running.machine_busy),
        }
        found.append(
            {
                "rate": running.rate,
                **{
                    name: round(a / b, 3) if a is not None and b else None
                    for name, (a, b) in pairs.items()
                },
            }
        )
    return found


def timeline(
    records: Records, sent: dict[int, int], marks: list[tuple[int, str]]
) -> list[list[object]]:
    """Per second of the wall clock from the generator's first: readings sent, scores
    appended, p50 and p99 of event → score of the readings sent in that second, alert
    records and model updates appended, and what happened then (``marks``: a window
    began, the trainer stopped)."""
    if not sent:
        return []
    origin = min(sent) * 1000
    last = max(max(sent) * 1000, int(records.scores[:, 0].max(initial=origin)))
    n = (last - origin) // 1000 + 1

    def per_second(times: Ints) -> list[int]:
        slots = (times[times >= origin] - origin) // 1000
        counts: list[int] = np.bincount(slots, minlength=n).tolist()
        return counts[:n]

    scores, events = records.scores, records.scores[:, 2]
    scored = per_second(scores[:, 0])
    alerts = per_second(records.alerts[:, 0])
    models = per_second(records.models)
    slot_of = (events - origin) // 1000
    order = np.argsort(slot_of, kind="stable")
    bounds = np.searchsorted(slot_of[order], np.arange(n + 1))
    delays = (scores[:, 0] - events)[order]
    noted: dict[int, str] = {}
    for at, text in marks:
        second = (at - origin) // 1000
        noted[second] = f"{noted[second]}; {text}" if second in noted else text
    rows: list[list[object]] = []
    for second in range(n):
        mine = delays[bounds[second] : bounds[second + 1]]
        rows.append(
            [
                second,
                sent.get(origin // 1000 + second, 0),
                scored[second],
                _p(mine, 50),
                _p(mine, 99),
                alerts[second],
                models[second],
                noted.get(second, ""),
            ]
        )
    return rows


TIMELINE_COLUMNS = (
    "second",
    "sent",
    "scored",
    "to_score_p50_ms",
    "to_score_p99_ms",
    "alert_records",
    "model_updates",
    "event",
)


# The report.

COLUMNS = (
    "phase",
    "rate",
    "sent/s",
    "scored/s",
    "backlog start → end",
    "→ score p50 / p99 ms",
    "→ read p50 / p99 ms",
    "→ alert p50 / p99 ms (n)",
    "model updates / series moved",
    "CPU gen / app / scorer / alerts / trainer / kafka",
    "busy",
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def rows(result: LatencyBenchResult) -> list[list[str]]:
    found = []
    for w in result.windows:
        jobs = ("app job", "scorer job", "alerts job", "trainer job")
        cpu = [w.cpu.get(n) for n in ("generator", *jobs, "kafka")]
        found.append(
            [
                w.phase,
                f"{w.rate:,.0f}",
                f"{w.sent_rate:,.0f}",
                f"{w.scored_rate:,.0f}",
                f"{w.backlog_start:,} → {w.backlog_end:,}",
                f"{_ms(w.to_score_p50_ms)} / {_ms(w.to_score_p99_ms)}",
                f"{_ms(w.to_score_read_p50_ms)} / {_ms(w.to_score_read_p99_ms)}",
                f"{_ms(w.to_alert_p50_ms)} / {_ms(w.to_alert_p99_ms)} ({w.alert_samples})",
                f"{w.model_updates:,} / {w.series_version_moved:,} of {w.series:,}",
                " / ".join("-" if c is None else f"{c:.2f}" for c in cpu),
                f"{w.machine_busy:.2f} of {result.machine.get('cpus')}",
            ]
        )
    return found


def summary(result: LatencyBenchResult) -> str:
    info = result.machine
    rates = ", ".join(f"{r:,.0f}" for r in result.rates)
    lines = [
        "# IoT application: sustained readings per second and end-to-end latency",
        "",
        f"Scorer: {result.scorer}; alerting: {result.alerts_in}. "
        f"{result.devices} devices, {rates} readings/s ({result.reading_bytes:.0f} bytes "
        f"each), {result.partitions} partitions a topic; {result.warmup_s:g} s warm-up, "
        f"{result.settle_s:g} s to settle after each change, {result.duration_s:g} s "
        f"measured a window; {result.anomalies_per_day:g} anomalies a day per device and "
        "metric.",
        f"Machine: {info.get('cpus')} CPUs ({info.get('cpu_model')}), "
        f"{info.get('memory_gib')} GiB, {info.get('platform')}, Python {info.get('python')}.",
        f"Load: at start `{result.uptime_at_start}`; at end `{result.uptime_at_end}`.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "| " + " | ".join("---" for _ in COLUMNS) + " |",
        *("| " + " | ".join(row) + " |" for row in rows(result)),
        "",
        "Latency: from a reading's event time (its send time) to its score's append to "
        "`scores` (the broker's clock), to a read_committed reader having it, and to an "
        "alert's append to `alerts` for alerts a reading raised. CPU: seconds per wall "
        "second (1.00 is one core); a job's CPU includes its JVM and Python workers.",
    ]
    for ratio in result.ratios:
        shown = ", ".join(f"{k} {v}" for k, v in ratio.items() if k != "rate" and v is not None)
        lines += ["", f"Trainer stopped over running, at {ratio['rate']:,.0f}/s: {shown}."]
    after = result.last_model_update_after_stop_s
    if after is None:
        last = "never appended"
    else:
        last = f"appended {abs(after):.1f} s {'after' if after >= 0 else 'before'} the stop"
    lines += [
        "",
        f"The trainer took {result.trainer_stop_s:.1f} s to stop; its last model update was "
        f"{last}. Readings sent {result.readings_sent:,}, scored "
        f"{result.readings_scored:,} ({result.scores_high:,} at or above {ALERT_SCORE}); "
        f"alerts {result.alerts}. The models of {MATURE_SHARE:.0%} of the series had learnt "
        f"their {WARMUP} readings {result.models_mature_s:.1f} s after the first model update.",
    ]
    return "\n".join(lines) + "\n"
