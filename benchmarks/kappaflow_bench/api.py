"""The job API's cost: the counting workload written as a user job, beside the built-in
count job, over the same backlog in the same run.

Three variants read one backlog of the counting benchmark's events (count.py), each
counting per key in 1-minute tumbling windows with a 10 s watermark, no lateness and no
id, writing a Kafka changelog and Redis:

- ``builtin``: the count job (``kappaflow count start``), measured as the counting
  benchmark measures it (count.measure_throughput, ``--available-now``);
- ``api-count``: the same workload on the job API (jobs/counts.py);
- ``api-aggregates``: the job API with the count, sum and mean of a number and the
  approximate distinct ids (jobs/aggregates.py).

Each is events/s from the moment its job runs (JobManager.start has returned) to the
last event accounted for in its outputs: for the count job, in its Redis statistics; for
a job on the API, in its status (``jobs status``: the events read through the last batch
its writer committed, after its Redis and Kafka writes). The variants take turns
(a, b, c, then b, c, a, ...), so that the machine's other work falls on all of them alike.
"""

from __future__ import annotations

import os
import random
import re
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kappaflow.errors import JobError
from kappaflow.jobs.manager import ACTIVE_STATES, JobManager, JobState
from kappaflow.jobs.status import job_status
from kappaflow.kafka.topics import DEFAULT_PARTITIONS, create_topic
from kappaflow.serving.client import redis_client, redis_prefix
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.waiting import wait_for
from kappaflow_bench.count import clean_up, event, measure_throughput, produce_backlog
from kappaflow_bench.report import machine, write_json

#: Variant → the user job's ``build`` and its output's name; None: the built-in count job.
VARIANTS: dict[str, tuple[str, str] | None] = {
    "builtin": None,
    "api-count": ("kappaflow_bench.jobs.counts:build", "counts"),
    "api-aggregates": ("kappaflow_bench.jobs.aggregates:build", "figures"),
}
#: A driver log's line per finished batch (jobs/runner.py ``_log_batches``).
_PROGRESS = re.compile(r"^progress \S+ batch (\d+): (\d+) rows; ms ?([^;]*)")
#: The batch writers' own lines: the count job's (counting/sink.py), an output's
#: (streams/output/writer.py).
_WRITER = re.compile(r"^(output \S+ )?batch \d+: ")
#: What a batch's progress says of each stateful operator's time and rows.
_OPERATOR_FIGURES = {
    "operatorName",
    "numRowsTotal",
    "numRowsUpdated",
    "allUpdatesTimeMs",
    "allRemovalsTimeMs",
    "commitTimeMs",
    "memoryUsedBytes",
}


@dataclass
class VariantRun:
    """One variant's run: its rate, and where its batches' time went (Spark's
    ``durationMs`` per step, summed over the batches, and the batch writers' lines)."""

    variant: str
    round: int
    rate: float
    seconds: float
    load_average_at_start: float
    batches: int = 0
    duration_ms: dict[str, int] = field(default_factory=dict)
    writer_lines: list[str] = field(default_factory=list)
    #: The stateful operators' figures in the last batch that read events, if the job's
    #: progress file still held it (a batch without events may have replaced it).
    state_operators: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ApiBenchResult:
    events: int
    keys: int
    event_bytes: int
    repeat: int
    produce_rate: float = 0.0
    runs: list[VariantRun] = field(default_factory=list)
    median_rate: dict[str, float] = field(default_factory=dict)
    ratio_to_builtin: dict[str, float] = field(default_factory=dict)
    #: Per variant, the median over rounds of its rate over the built-in job's rate in
    #: the same round: the rounds' drift (the machine's pace moves over minutes) cancels.
    paired_ratio_median: dict[str, float] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)


def run(
    settings: Settings,
    *,
    events: int,
    keys: int,
    repeat: int,
    out_dir: Path,
    overrides: SettingsOverrides,
) -> ApiBenchResult:
    """``repeat`` rounds of every variant over one backlog; medians and ratios."""
    result = ApiBenchResult(
        events=events,
        keys=keys,
        event_bytes=len(event(random.Random(0), 0, keys, 0, amount=True)),
        repeat=repeat,
        machine=machine(),
    )
    topic = f"bench.api.{uuid.uuid4().hex[:6]}"
    create_topic(settings.kafka, topic, partitions=DEFAULT_PARTITIONS)
    try:
        result.produce_rate = produce_backlog(settings, topic, events, keys, amount=True)
        names = list(VARIANTS)
        for round_ in range(1, repeat + 1):
            # Each round starts with the next variant: the first run after the backlog
            # was produced (the broker still flushing it) is not always the same one's.
            shift = (round_ - 1) % len(names)
            for variant in names[shift:] + names[:shift]:
                found = _measure(settings, variant, topic, events, overrides)
                found.round = round_
                result.runs.append(found)
                print(f"{variant} round {round_}: {found.rate:,.0f} events/s", flush=True)
    finally:
        clean_up(settings, [topic], [])
    for variant in VARIANTS:
        rates = [r.rate for r in result.runs if r.variant == variant]
        result.median_rate[variant] = statistics.median(rates)
    base = result.median_rate["builtin"]
    result.ratio_to_builtin = {v: rate / base for v, rate in result.median_rate.items()}
    builtin = {r.round: r.rate for r in result.runs if r.variant == "builtin"}
    for variant in VARIANTS:
        paired = [r.rate / builtin[r.round] for r in result.runs if r.variant == variant]
        result.paired_ratio_median[variant] = statistics.median(paired)
    result.machine["load_average_at_end"] = os.getloadavg()
    write_json(out_dir / "result.json", result)
    return result


def _measure(
    settings: Settings, variant: str, topic: str, events: int, overrides: SettingsOverrides
) -> VariantRun:
    load = os.getloadavg()[0]
    seen: dict[str, VariantRun] = {}

    def breakdown(job: str) -> None:
        seen["run"] = _breakdown(settings, job, events)

    app = VARIANTS[variant]
    if app is None:
        rate, seconds = measure_throughput(settings, topic, events, overrides, on_done=breakdown)
    else:
        rate, seconds = measure_app(settings, topic, events, *app, overrides, on_done=breakdown)
    found = seen.get("run") or VariantRun(variant, 0, 0.0, 0.0, 0.0)
    found.variant, found.rate, found.seconds, found.load_average_at_start = (
        variant,
        rate,
        seconds,
        load,
    )
    return found


def measure_app(
    settings: Settings,
    topic: str,
    events: int,
    app: str,
    output: str,
    overrides: SettingsOverrides,
    on_done: Callable[[str], None] | None = None,
) -> tuple[float, float]:
    """Events/s of the user job ``app`` over the backlog in ``topic``: from the job
    running to ``events`` accounted for in ``output``'s status. ``on_done`` gets the
    job's name before the job and what it wrote are removed."""
    name = f"bench-api-{uuid.uuid4().hex[:6]}"
    jobs = JobManager(settings)
    try:
        jobs.start(name, app, {"topic": topic}, overrides=overrides)
        started = time.perf_counter()
        wait_for(
            lambda: True if _accounted(settings, name, output) >= events else None,
            timeout=3600,
            interval=0.5,
            what=f"the backlog to be accounted for by {app}",
        )
        elapsed = time.perf_counter() - started
        if on_done is not None:
            on_done(name)
    finally:
        if jobs.get_state(name) in ACTIVE_STATES:
            jobs.stop(name)
        _forget_app(settings, name, output)
    return events / elapsed, elapsed


def _accounted(settings: Settings, job: str, output: str) -> int:
    """Events read by ``output`` through its last committed batch; a failed job fails."""
    found = job_status(settings, job)
    if found["state"] in (JobState.FAILED, JobState.CRASHED):
        raise JobError(f"job {job} {found['state']}: {found['error']}")
    return int(found["outputs"].get(output, {}).get("events_read") or 0)


def _forget_app(settings: Settings, job: str, output: str) -> None:
    """Remove the user job: its topics, its Redis keys, its record and checkpoint."""
    client = redis_client(settings)
    for key in client.scan_iter(match=redis_prefix(job, output) + "*", count=1000):
        client.delete(key)
    clean_up(settings, [f"{job}.{output}"], [job])


def _breakdown(settings: Settings, job: str, events: int) -> VariantRun:
    """The job's batches from its driver log, once the log has them all (the runner
    logs a batch within a second of its end)."""
    log = JobManager(settings).job_dir(job) / "driver.log"

    def lines() -> list[str] | None:
        text = log.read_text(errors="replace").splitlines() if log.exists() else []
        rows = sum(int(m[2]) for line in text if (m := _PROGRESS.match(line)))
        return text if rows >= events else None

    try:
        text = wait_for(lines, timeout=30, interval=0.5, what="the driver log's batches")
    except TimeoutError:
        text = log.read_text(errors="replace").splitlines() if log.exists() else []
    found = VariantRun("", 0, 0.0, 0.0, 0.0)
    for line in text:
        if (match := _PROGRESS.match(line)) is not None:
            found.batches += int(match[2]) > 0
            for pair in match[3].split():
                step, _, ms = pair.partition("=")
                found.duration_ms[step] = found.duration_ms.get(step, 0) + int(ms)
        elif _WRITER.match(line):
            found.writer_lines.append(line)
    for progress in JobManager(settings).progress(job).values():
        if isinstance(progress, dict) and progress.get("numInputRows"):
            found.state_operators += [
                {k: v for k, v in o.items() if k in _OPERATOR_FIGURES}
                for o in progress.get("stateOperators") or []
            ]
    return found
