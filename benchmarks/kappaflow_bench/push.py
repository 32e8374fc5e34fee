"""Push fan-out: changes per second delivered to many Server-Sent Events subscribers, and
the time from a change's Kafka commit to its arrival at a subscriber, beside a plain Kafka
consumer of the same topic measured in the same run.

The changes are a windowed count's changelog, written as a job's batch writer writes
them (``streams.writer.changelog_records``, one ``KafkaPublisher`` transaction per batch
with its commit marker), by this process at a rate it sets, every ``batch_interval``
seconds: so the rate is the benchmark's to choose, not the engine's. The job is recorded
(its record and plan) as a job's driver records it, so the service finds its output's
topic as it finds any job's.

The service is ``kappaflow api serve``, a process of its own (``EmbeddedApi``); the
subscribers are ``SUBSCRIBER_PROCESSES`` processes of asyncio connections reading the
raw stream (no SSE library: the readers must cost less than what they measure). Each
subscriber notes, per batch, when its first and its last change arrived and how many
came; the baseline, a ``read_committed`` consumer in this process, notes the same.

Per rate, after a warm-up: the changes committed, the changes delivered to subscribers
(all of them: lost or dropped ones would show), deliveries per second, the latency from
the commit (``commit_transaction`` returned) to the arrival of a batch's first and last
change at each subscriber, and the CPU seconds per second of each process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
from confluent_kafka import KafkaError, TopicPartition

from kappaflow.api.server import EmbeddedApi
from kappaflow.jobs.files import PLAN, write_atomically
from kappaflow.jobs.manager import JobManager, JobRecord, JobState
from kappaflow.kafka.clients import consumer
from kappaflow.kafka.topics import DEFAULT_PARTITIONS, create_topic
from kappaflow.procs import free_port
from kappaflow.settings import Settings
from kappaflow.streams.output.backends import KafkaPublisher, commits_topic
from kappaflow.streams.output.writer import changelog_records
from kappaflow.timeutil import iso
from kappaflow.waiting import wait_for
from kappaflow_bench.report import machine, percentile, write_json

#: A job of its own each run: its topic holds only this run's changes.
JOB = f"push-bench-{uuid.uuid4().hex[:8]}"
OUTPUT = "counts"
TOPIC = f"{JOB}.{OUTPUT}"
SUBSCRIBER_PROCESSES = 2
WINDOW_MS = 10_000
COLUMNS = (
    "rate /s",
    "subscribers",
    "committed",
    "delivered",
    "lost",
    "deliveries /s",
    "p50 ms",
    "p99 ms",
    "p99 last ms",
    "kafka p99 ms",
    "service cpu",
)


@dataclass
class Step:
    rate: float
    subscribers: int
    committed: int = 0
    batches: int = 0
    delivered: int = 0
    expected: int = 0
    dropped: int = 0
    deliveries_per_s: float = 0.0
    #: Commit → arrival of a batch's first / last change, at every subscriber (ms).
    first_ms: dict[str, float | None] = field(default_factory=dict)
    last_ms: dict[str, float | None] = field(default_factory=dict)
    #: The same at the plain Kafka consumer.
    kafka_first_ms: dict[str, float | None] = field(default_factory=dict)
    kafka_last_ms: dict[str, float | None] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)


def _stats(values: list[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in (50, 90, 99, 100)}


class Writer:
    """A windowed count's changes at ``rate`` per second, one transaction per batch."""

    def __init__(self, settings: Settings, keys: int) -> None:
        self.publisher = KafkaPublisher(settings, JOB)
        self.keys = [json.dumps([f"k{i:05d}"]) for i in range(keys)]
        self.versions: dict[tuple[str, int], int] = {}
        self.next_key = 0
        self.batch_id = 0
        #: batch id → (size, commit time, epoch s)
        self.commits: dict[int, tuple[int, float]] = {}

    def batch(self, size: int) -> None:
        now_ms = int(time.time() * 1000)
        start = now_ms - now_ms % WINDOW_MS
        keys, versions = [], []
        for _ in range(size):
            key = self.keys[self.next_key % len(self.keys)]
            self.next_key += 1
            version = self.versions.get((key, start), 0) + 1
            self.versions[(key, start)] = version
            keys.append(key)
            versions.append(version)
        changes = pa.table(
            {
                "key": pa.array(keys, pa.string()),
                "window_start": pa.array([start] * size, pa.int64()),
                "window_end": pa.array([start + WINDOW_MS] * size, pa.int64()),
                "values": pa.array([f'{{"count": {v}}}' for v in versions], pa.string()),
                "previous": pa.array(
                    [f'{{"count": {v - 1}}}' if v > 1 else None for v in versions], pa.string()
                ),
                "kind": pa.array(["provisional"] * size, pa.string()),
                "version": pa.array(versions, pa.int64()),
                "watermark": pa.array([now_ms - 5_000] * size, pa.int64()),
            }
        )
        records = changelog_records(TOPIC, ("key",), changes, self.batch_id)
        self.publisher.publish(OUTPUT, self.batch_id, records, {"batch": {"events": size}})
        self.commits[self.batch_id] = (size, time.time())
        self.batch_id += 1


class KafkaBaseline:
    """A read_committed consumer of the topic: each batch's first and last arrival."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.arrivals: dict[int, list[float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kafka-baseline", daemon=True)

    def _run(self) -> None:
        reader = consumer(self.settings.kafka, **{"fetch.wait.max.ms": 5})
        reader.assign(
            [TopicPartition(TOPIC, p, 0) for p in range(DEFAULT_PARTITIONS)]  # from the start
        )
        try:
            while not self.stop.is_set():
                for message in reader.consume(500, timeout=0.1):
                    error = message.error()
                    if error is not None and error.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(str(error))
                    if error is None:
                        _arrived(self.arrivals, _batch_of(message.value() or b""), time.time())
        finally:
            reader.close()


def _batch_of(value: bytes) -> int:
    at = value.rfind(b'"batch": ') + 9
    end = at
    while end < len(value) and 48 <= value[end] <= 57:
        end += 1
    return int(value[at:end])


def _arrived(arrivals: dict[int, list[float]], batch: int, now: float, n: int = 1) -> None:
    seen = arrivals.get(batch)
    if seen is None:
        arrivals[batch] = [now, now, n]
    else:
        seen[1] = now
        seen[2] += n


# The subscribers' side: a process of many connections (``python -m kappaflow_bench.push``).


async def _subscriber(url: str, path: str, ready: asyncio.Event, out: dict[str, Any]) -> None:
    """One SSE connection: skips the snapshot, then notes each batch's arrivals; resumes
    with its last event id when dropped."""
    arrivals: dict[int, list[float]] = {}
    out["arrivals"] = arrivals
    out["dropped"] = 0
    host, port = url.removeprefix("http://").split(":")
    last_id: str | None = None
    while True:
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 22)
        resume = f"Last-Event-ID: {last_id}\r\n" if last_id else ""
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n"
            f"{resume}\r\n".encode()
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(head.decode(errors="replace"))
        buffer = b""
        if last_id is None:
            # Chunked transfer: the snapshot is within the first event; skip to its end.
            while (
                b"event: snapshot" not in buffer
                or b"\n\n" not in buffer.split(b"event: snapshot", 1)[1]
            ):
                buffer += await reader.read(1 << 16)
            buffer = buffer.split(b"event: snapshot", 1)[1].split(b"\n\n", 1)[1]
            ready.set()
        dropped = False
        while not dropped:
            chunk = await reader.read(1 << 18)
            if not chunk:
                break
            now = time.time()
            buffer += chunk
            end = buffer.rfind(b"\n\n")
            if end < 0:
                continue
            done, buffer = buffer[: end + 2], buffer[end + 2 :]
            at = done.find(b'"batch": ')
            while at >= 0:
                stop = at + 9
                while 48 <= done[stop] <= 57:
                    stop += 1
                _arrived(arrivals, int(done[at + 9 : stop]), now)
                at = done.find(b'"batch": ', stop)
            last = done.rfind(b"id: ")
            if last >= 0:
                last_id = done[last + 4 : done.index(b"\n", last)].decode()
            if b"event: error" in done:
                dropped = True
                out["dropped"] += 1
                error = done[done.index(b"event: error") :].split(b"\n")[1]
                out["error"] = error.decode(errors="replace")
        writer.close()
        if not dropped:
            return


async def _subscribers(url: str, path: str, n: int, out_file: Path) -> None:
    outs: list[dict[str, Any]] = [{} for _ in range(n)]
    readies = [asyncio.Event() for _ in range(n)]
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(_subscriber(url, path, readies[i], outs[i])))
        if i % 50 == 49:
            await asyncio.sleep(0)  # let the connections open a few at a time
    await asyncio.gather(*(r.wait() for r in readies))
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for task in tasks:
        task.cancel()
    out_file.write_text(
        json.dumps(
            [
                {
                    "arrivals": {str(b): v for b, v in o.get("arrivals", {}).items()},
                    "dropped": o.get("dropped", 0),
                    "error": o.get("error"),
                }
                for o in outs
            ]
        )
    )


def main(argv: list[str]) -> None:
    url, path, n, out_file = argv[0], argv[1], int(argv[2]), Path(argv[3])
    asyncio.run(_subscribers(url, path, n, out_file))


# The run.


def _record_job(settings: Settings) -> None:
    """The job's record and plan, as a driver writes them, so that the service finds it."""
    jobs = JobManager(settings)
    home = jobs.job_dir(JOB)
    home.mkdir(parents=True, exist_ok=True)
    JobRecord(
        JOB,
        "kappaflow_bench.push",
        {},
        state=JobState.RUNNING,
        pid=os.getpid(),
        started_at=iso(datetime.now(UTC)),
    ).save(home / "job.json")
    plan = {
        "job": JOB,
        "sources": [],
        "tables": [],
        "outputs": [{"name": OUTPUT, "source": None, "sinks": [{"kafka": TOPIC}]}],
    }
    write_atomically(home / PLAN, json.dumps(plan) + "\n")


def run(
    settings: Settings,
    *,
    subscribers: int,
    rates: list[float],
    duration_s: float,
    warmup_s: float,
    batch_interval_s: float,
    keys: int,
    out_dir: Path,
    say: Callable[[str], None],
) -> dict[str, Any]:
    settings = settings.model_copy(
        update={"api": settings.api.model_copy(update={"port": free_port()})}
    )
    create_topic(settings.kafka, TOPIC, exist_ok=True)
    create_topic(settings.kafka, commits_topic(JOB), partitions=1, exist_ok=True)
    _record_job(settings)
    writer = Writer(settings, keys)
    writer.batch(keys)  # every key once: the snapshot's contents
    service = EmbeddedApi(settings)
    service.start()
    baseline = KafkaBaseline(settings)
    baseline.thread.start()
    processes: list[subprocess.Popen[str]] = []
    files = [out_dir / f"subscribers-{i}.json" for i in range(SUBSCRIBER_PROCESSES)]
    out_dir.mkdir(parents=True, exist_ok=True)
    steps: list[Step] = []
    try:
        path = f"/v1/jobs/{JOB}/outputs/{OUTPUT}/changes"
        share = [subscribers // SUBSCRIBER_PROCESSES] * SUBSCRIBER_PROCESSES
        share[0] += subscribers - sum(share)
        for n, out in zip(share, files, strict=True):
            processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "kappaflow_bench.push",
                        service.url,
                        path,
                        str(n),
                        str(out),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for process in processes:
            assert process.stdout is not None
            line = process.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a subscriber process did not start: {line!r}")
        say(f"{subscribers} subscribers connected to {service.url}{path}")
        procs = {
            "service": psutil.Process(service.status().pid or 0),
            "subscribers": [psutil.Process(p.pid) for p in processes],
            "benchmark": psutil.Process(),
        }
        measured: list[tuple[Step, range, dict[str, float]]] = []
        for rate in rates:
            step = Step(rate, subscribers)
            size = max(1, round(rate * batch_interval_s))
            _pace(writer, size, batch_interval_s, warmup_s)
            first = writer.batch_id
            cpu_before = _cpu(procs)
            began = time.monotonic()
            _pace(writer, size, batch_interval_s, duration_s)
            elapsed = time.monotonic() - began
            cpu = {k: (v - cpu_before[k]) / elapsed for k, v in _cpu(procs).items()}
            measured.append((step, range(first, writer.batch_id), cpu))
            steps.append(step)
            say(f"rate {rate:g}/s: {writer.batch_id - first} batches of {size} committed")
        # Every change delivered or not, before the readers stop.
        last = writer.batch_id - 1
        wait_for(lambda: (last in baseline.arrivals) or None, timeout=120, what="the last batch")
        _settle(processes, files)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(timeout=60)
        baseline.stop.set()
        service.stop()
    subscribers_seen: list[dict[str, Any]] = []
    for out in files:
        subscribers_seen += json.loads(out.read_text())
    for step, batches, cpu in measured:
        _measure(step, batches, cpu, writer, baseline, subscribers_seen)
    result = {
        "machine": machine(),
        "subscribers": subscribers,
        "batch_interval_s": batch_interval_s,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "keys": keys,
        "steps": [step.__dict__ for step in steps],
    }
    write_json(out_dir / "result.json", result)
    return result


def _settle(processes: list[subprocess.Popen[str]], files: list[Path]) -> None:
    """Gives the subscribers a moment past the last batch: it is delivered or counted as
    lost; then they write what they saw."""
    # A grace period, not a condition: what has not arrived by then is counted lost.
    time.sleep(10)
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process, out in zip(processes, files, strict=True):
        process.wait(timeout=120)
        if not out.exists():
            raise RuntimeError(f"subscriber process {process.pid} wrote nothing")


def _pace(writer: Writer, size: int, interval_s: float, duration_s: float) -> None:
    """Batches of ``size`` every ``interval_s`` for ``duration_s`` (a batch that takes
    longer than the interval delays the next: the rate then falls short, and shows)."""
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < duration_s:
        writer.batch(size)
        n += 1
        pause = start + n * interval_s - time.monotonic()
        if pause > 0:
            time.sleep(pause)


def _cpu(procs: dict[str, Any]) -> dict[str, float]:
    def seconds(p: psutil.Process) -> float:
        times = p.cpu_times()
        return float(times.user + times.system)

    return {
        "service": seconds(procs["service"]),
        "subscribers": sum(seconds(p) for p in procs["subscribers"]),
        "benchmark": seconds(procs["benchmark"]),
    }


def _measure(
    step: Step,
    batches: range,
    cpu: dict[str, float],
    writer: Writer,
    baseline: KafkaBaseline,
    seen: list[dict[str, Any]],
) -> None:
    step.cpu = {k: round(v, 3) for k, v in cpu.items()}
    step.batches = len(batches)
    step.committed = sum(writer.commits[b][0] for b in batches)
    step.expected = step.committed * step.subscribers
    firsts, lasts = [], []
    for subscriber in seen:
        step.dropped += subscriber["dropped"]
        arrivals = subscriber["arrivals"]
        for b in batches:
            got = arrivals.get(str(b))
            if got is None:
                continue
            committed_at = writer.commits[b][1]
            step.delivered += int(got[2])
            firsts.append((got[0] - committed_at) * 1000)
            lasts.append((got[1] - committed_at) * 1000)
    span = (batches.stop - batches.start) and (
        writer.commits[batches.stop - 1][1] - writer.commits[batches.start][1]
    )
    step.deliveries_per_s = round(step.delivered / span, 1) if span else 0.0
    step.first_ms, step.last_ms = _stats(firsts), _stats(lasts)
    kafka_firsts, kafka_lasts = [], []
    for b in batches:
        got = baseline.arrivals.get(b)
        if got is not None:
            kafka_firsts.append((got[0] - writer.commits[b][1]) * 1000)
            kafka_lasts.append((got[1] - writer.commits[b][1]) * 1000)
    step.kafka_first_ms, step.kafka_last_ms = _stats(kafka_firsts), _stats(kafka_lasts)


def rows(result: dict[str, Any]) -> list[list[str]]:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    return [
        [
            f"{s['rate']:g}",
            str(s["subscribers"]),
            str(s["committed"]),
            str(s["delivered"]),
            str(s["expected"] - s["delivered"]),
            f"{s['deliveries_per_s']:,.0f}",
            ms(s["first_ms"]["p50"]),
            ms(s["first_ms"]["p99"]),
            ms(s["last_ms"]["p99"]),
            ms(s["kafka_last_ms"]["p99"]),
            f"{s['cpu']['service']:.2f}",
        ]
        for s in result["steps"]
    ]


if __name__ == "__main__":
    main(sys.argv[1:])
