"""Scale-out: one job's backlog on a standalone cluster of one worker, then of two, and
what writing its output costs the driver.

A backlog of the counting benchmark's events (count.py) is read by a job on the job API
running on ``kappaflow spark start``'s standalone cluster, started for each run with
``workers`` workers of ``cores`` cores each (the cluster is stopped between runs, so an
executor's JIT and caches start cold each time). Two jobs:

- ``counts``: events per key in 1-minute windows (jobs/counts.py), a small output;
- ``passthrough``: every event to a topic (jobs/passthrough.py), an output as large as
  the input.

Each run reports events/s from the job running to the backlog accounted for in its
status, and its driver's share: the CPU seconds and the peak resident memory of the
driver's process tree (the Python driver and its JVM; a cluster's executors run under
the workers, not under the driver), sampled every 0.5 s. The runs take turns (1 worker,
2 workers, then 2, 1, ...), so that the machine's drift falls on both alike.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from kappaflow.jobs.manager import ACTIVE_STATES, JobManager
from kappaflow.kafka.topics import create_topic
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.spark.standalone import StandaloneCluster
from kappaflow.waiting import wait_for
from kappaflow_bench.api import _accounted, _forget_app
from kappaflow_bench.count import clean_up, produce_backlog
from kappaflow_bench.report import machine, write_json

#: Job → its ``build`` and its output's name.
JOBS = {
    "counts": ("kappaflow_bench.jobs.counts:build", "counts"),
    "passthrough": ("kappaflow_bench.jobs.passthrough:build", "records"),
}
#: The topic's partitions: enough tasks for two workers' cores.
PARTITIONS = 4


@dataclass
class ScaleRun:
    job: str
    workers: int
    cores: int
    round: int
    events: int
    rate: float = 0.0
    seconds: float = 0.0
    driver_cpu_s: float = 0.0
    driver_peak_rss_mb: float = 0.0
    load_average_at_start: float = 0.0


@dataclass
class ScaleOutResult:
    events: int
    keys: int
    cores_per_worker: int
    repeat: int
    produce_rate: float = 0.0
    runs: list[ScaleRun] = field(default_factory=list)
    #: Per job, the median over rounds of (rate on 2 workers) / (rate on 1 worker).
    speedup: dict[str, float] = field(default_factory=dict)
    #: Per job and worker count, the median driver CPU seconds and peak memory.
    driver: dict[str, dict[str, Any]] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)


class _DriverSampler:
    """The driver process tree's CPU time and peak resident memory."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.cpu: dict[int, float] = {}
        self.peak_rss = 0

    def sample(self) -> None:
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        rss = 0
        for proc in tree:
            try:
                times = proc.cpu_times()
                self.cpu[proc.pid] = times.user + times.system
                rss += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        self.peak_rss = max(self.peak_rss, rss)


def run(
    settings: Settings,
    *,
    events: int,
    keys: int,
    workers: tuple[int, ...],
    cores: int,
    executor_memory: str,
    repeat: int,
    out_dir: Path,
    overrides: SettingsOverrides,
) -> ScaleOutResult:
    """``repeat`` rounds of each job on each worker count; speed-ups and the driver's
    share. ``overrides``: the command's own (its state directory, ...), under the
    cluster's."""
    result = ScaleOutResult(
        events=events, keys=keys, cores_per_worker=cores, repeat=repeat, machine=machine()
    )
    topic = f"bench.scale.{uuid.uuid4().hex[:6]}"
    create_topic(settings.kafka, topic, partitions=PARTITIONS)
    cluster = StandaloneCluster(settings)
    try:
        result.produce_rate = produce_backlog(settings, topic, events, keys)
        for round_ in range(1, repeat + 1):
            order = list(workers) if round_ % 2 else list(reversed(workers))
            for n in order:
                for job in JOBS:
                    cluster.stop()
                    cluster.start(n, cores=cores, memory=executor_memory)
                    on_cluster = SettingsOverrides(
                        spark_master=cluster.master_url,
                        spark_conf={
                            "spark.cores.max": str(n * cores),
                            "spark.executor.memory": executor_memory,
                        },
                    ).over(overrides)
                    found = _measure(settings, job, topic, events, n, cores, on_cluster)
                    found.round = round_
                    result.runs.append(found)
                    print(
                        f"{job} on {n} worker(s) x {cores} core(s), round {round_}: "
                        f"{found.rate:,.0f} events/s, driver {found.driver_cpu_s:.1f} cpu-s, "
                        f"{found.driver_peak_rss_mb:,.0f} MB peak",
                        flush=True,
                    )
    finally:
        cluster.stop()
        clean_up(settings, [topic], [])
    _summarise(result, workers)
    result.machine["load_average_at_end"] = os.getloadavg()
    write_json(out_dir / "result.json", result)
    return result


def _measure(
    settings: Settings,
    job: str,
    topic: str,
    events: int,
    workers: int,
    cores: int,
    overrides: SettingsOverrides,
) -> ScaleRun:
    app, output = JOBS[job]
    found = ScaleRun(job, workers, cores, 0, events, load_average_at_start=os.getloadavg()[0])
    name = f"bench-scale-{uuid.uuid4().hex[:6]}"
    jobs = JobManager(settings)
    try:
        record = jobs.start(name, app, {"topic": topic}, overrides=overrides)
        assert record.pid is not None
        sampler = _DriverSampler(record.pid)
        started = time.perf_counter()

        def done() -> bool | None:
            sampler.sample()
            return True if _accounted(settings, name, output) >= events else None

        wait_for(done, timeout=3600, interval=0.5, what=f"the backlog accounted for by {job}")
        found.seconds = time.perf_counter() - started
        sampler.sample()
        found.rate = events / found.seconds
        found.driver_cpu_s = sum(sampler.cpu.values())
        found.driver_peak_rss_mb = sampler.peak_rss / 2**20
    finally:
        if jobs.get_state(name) in ACTIVE_STATES:
            jobs.stop(name)
        _forget_app(settings, name, output)
    return found


def _summarise(result: ScaleOutResult, workers: tuple[int, ...]) -> None:
    low, high = min(workers), max(workers)
    for job in JOBS:
        runs = [r for r in result.runs if r.job == job]
        by_round: dict[int, dict[int, float]] = {}
        for r in runs:
            by_round.setdefault(r.round, {})[r.workers] = r.rate
        ratios = [rates[high] / rates[low] for rates in by_round.values() if len(rates) > 1]
        if ratios:
            result.speedup[job] = statistics.median(ratios)
        result.driver[job] = {
            str(n): {
                "rate": statistics.median(r.rate for r in runs if r.workers == n),
                "driver_cpu_s": statistics.median(r.driver_cpu_s for r in runs if r.workers == n),
                "driver_peak_rss_mb": statistics.median(
                    r.driver_peak_rss_mb for r in runs if r.workers == n
                ),
            }
            for n in workers
        }
