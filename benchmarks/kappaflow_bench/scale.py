"""The counting scale run: a million distinct keys, 1-minute windows, a 4 GiB driver.

Events over ``keys`` distinct keys (each key in turn, scrambled) are sent open loop at
``rate`` per second, their event time running ``speedup`` times faster than the clock.
Every two seconds the run samples the job's own account of its state (``count status``:
keys held per window, the state store's rows and bytes) and the memory of the driver's
process tree. State bounded by the watermark shows as keys held levelling off, and
falling as windows are forgotten, while the distinct keys seen keep growing.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from kappaflow.counting.spec import CountSpec
from kappaflow.counting.store import CountStore
from kappaflow.jobs.manager import JobManager, JobState
from kappaflow.kafka.clients import producer
from kappaflow.kafka.records import produce_with_retry
from kappaflow.kafka.topics import DEFAULT_PARTITIONS, create_topic
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.waiting import wait_for
from kappaflow_bench.count import PAD, clean_up
from kappaflow_bench.report import write_json

#: A prime, so that stepping by it visits every key before repeating one (for any number
#: of keys it does not divide).
STRIDE = 7_919


@dataclass
class ScaleSample:
    at_s: float
    sent: int
    distinct_keys_sent: int
    processed: int
    window_keys: int
    open_windows: int
    state_rows: int
    state_bytes: int
    rss_bytes: int


@dataclass
class ScaleResult:
    keys: int
    rate: int
    seconds: float
    speedup: int
    driver_memory: str
    events_sent: int = 0
    distinct_keys_sent: int = 0
    events_processed: int = 0
    max_window_keys: int = 0
    last_window_keys: int = 0
    max_rss_bytes: int = 0
    job_state: JobState = JobState.ABSENT
    samples: list[ScaleSample] = field(default_factory=list)


def run_scale(
    settings: Settings,
    *,
    keys: int,
    rate: int,
    seconds: float,
    speedup: int,
    driver_memory: str,
    out_dir: Path,
    overrides: SettingsOverrides,
) -> ScaleResult:
    topic = f"bench.scale.{uuid.uuid4().hex[:6]}"
    create_topic(settings.kafka, topic, partitions=DEFAULT_PARTITIONS)
    name = f"bench-scale-{uuid.uuid4().hex[:6]}"
    spec = CountSpec(
        source=topic, key_field="key", time_field="ts", window_ms=60_000, watermark_ms=10_000
    )
    job_overrides = SettingsOverrides(spark_driver_memory=driver_memory).over(overrides)
    jobs = JobManager(settings)
    record = jobs.start(name, "count", spec.to_params(), overrides=job_overrides)
    store = CountStore(redis_client(settings), name)
    result = ScaleResult(keys, rate, seconds, speedup, driver_memory)
    offset = random.Random(5).randrange(keys)
    out = producer(settings.kafka, **{"linger.ms": 20, "compression.type": "lz4"})
    seen: set[int] = set()
    origin_ms = int(time.time() * 1000)
    started = time.perf_counter()
    next_sample = started
    sent = 0
    try:
        while (now := time.perf_counter()) - started < seconds:
            due = int((now - started) * rate) - sent
            stamp = origin_ms + int((now - started) * 1000 * speedup)
            for _ in range(max(0, due)):
                # Every key in turn, in a scrambled order: n events reach min(n, keys) keys.
                key = (sent * STRIDE + offset) % keys
                seen.add(key)
                value = json.dumps({"key": f"k{key}", "ts": stamp, "pad": PAD})
                produce_with_retry(out, topic, value.encode(), poll_s=0.05)
                sent += 1
            out.poll(0)
            if now >= next_sample:
                result.samples.append(
                    _sample(jobs, store, name, record.pid, now - started, sent, len(seen))
                )
                next_sample = now + 2.0
            time.sleep(0.002)
        out.flush(60)
        wait_for(
            lambda: (
                True if _processed(store) >= sent or jobs.get_state(name) != "running" else None
            ),
            timeout=600,
            interval=1.0,
            what="the scale job to catch up",
        )
        result.samples.append(
            _sample(jobs, store, name, record.pid, time.perf_counter() - started, sent, len(seen))
        )
    finally:
        result.job_state = jobs.get_state(name)
        if result.job_state is JobState.RUNNING:
            jobs.stop(name)
        processed = _processed(store)
        clean_up(settings, [topic], [name])
    result.events_sent, result.distinct_keys_sent = sent, len(seen)
    result.events_processed = processed
    result.max_window_keys = max((s.window_keys for s in result.samples), default=0)
    result.last_window_keys = result.samples[-1].window_keys if result.samples else 0
    result.max_rss_bytes = max((s.rss_bytes for s in result.samples), default=0)
    write_json(out_dir / "result.json", result)
    return result


def _processed(store: CountStore) -> int:
    return store.stats().accounted


def _sample(
    jobs: JobManager,
    store: CountStore,
    name: str,
    pid: int | None,
    at: float,
    sent: int,
    distinct: int,
) -> ScaleSample:
    stats = store.stats()
    progress = jobs.progress(name).get(name) or {}
    operators = progress.get("stateOperators") or []
    return ScaleSample(
        at_s=round(at, 1),
        sent=sent,
        distinct_keys_sent=distinct,
        processed=_processed(store),
        window_keys=stats.window_keys,
        open_windows=stats.open_windows,
        state_rows=sum(int(op.get("numRowsTotal", 0)) for op in operators),
        state_bytes=sum(int(op.get("memoryUsedBytes", 0)) for op in operators),
        rss_bytes=_tree_rss(pid),
    )


def _tree_rss(pid: int | None) -> int:
    """Resident memory of the driver and everything it started (JVM, Python workers)."""
    if pid is None:
        return 0
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0
