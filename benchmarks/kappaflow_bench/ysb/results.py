"""A run's results: the original's seen.txt and updated.txt, latency, result.json, a plot.

Latency is the original method's: for each (campaign, window), the time of the last
write of its count minus the window's start (``updated.txt``), minus the window's 10 s
length, over the windows whose value is at least 10 s (the original analysis drops the
others: windows that never saw an update after they ended). Percentiles are over
windows, not events. For the Kafka sink, the last write is the broker's append time of
the window's last record.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from kappaflow.errors import KafkaClusterError
from kappaflow.kafka.clients import consumer
from kappaflow.kafka.topics import topic_partitions
from kappaflow.settings import KafkaSettings
from kappaflow_bench.report import percentile, write_json
from kappaflow_bench.ysb.store import WindowStat, job_windows
from kappaflow_bench.ysb.workload import WINDOW_MS

PERCENTILES = (1, 10, 25, 50, 75, 90, 99, 100)


@dataclass
class RunResult:
    engine: str
    sink: str
    rate_offered: int
    duration_s: float
    versions: dict[str, str] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    rate_achieved: float = 0.0
    generator: dict[str, Any] = field(default_factory=dict)
    events: int = 0
    views: int = 0
    windows: int = 0
    windows_measured: int = 0
    latency_ms: dict[str, int | None] = field(default_factory=dict)
    mismatched_windows: int = 0
    mismatches: list[dict[str, object]] = field(default_factory=list)
    drain_s: float | None = None
    #: CPU seconds the engine's processes used from the measured schedule's start to the
    #: end of the drain, and the measured events per such second: events/s per core.
    engine_cpu_s: float | None = None
    events_per_cpu_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def summary_rows(self) -> list[list[str]]:
        lat = self.latency_ms

        def ms(key: str) -> str:
            value = lat.get(key)
            return "-" if value is None else f"{value:,} ms"

        return [
            ["engine / sink", f"{self.engine} / {self.sink}"],
            ["offered rate", f"{self.rate_offered:,}/s for {self.duration_s:g}s"],
            ["achieved rate (generator)", f"{self.rate_achieved:,.0f}/s"],
            ["events / views", f"{self.events:,} / {self.views:,}"],
            ["windows (measured)", f"{self.windows} ({self.windows_measured})"],
            [
                "latency p50 / p90 / p99 / max",
                " / ".join(ms(k) for k in ("p50", "p90", "p99", "max")),
            ],
            ["mismatched windows", str(self.mismatched_windows)],
            [
                "engine CPU / events per CPU-second",
                "-"
                if self.engine_cpu_s is None or self.events_per_cpu_s is None
                else f"{self.engine_cpu_s:,.1f} s / {self.events_per_cpu_s:,.0f}",
            ],
        ]


def window_latencies(stats: Sequence[WindowStat], measured_from_ms: int = 0) -> list[int]:
    """``updated - 10000`` of every window with ``updated >= 10000`` starting at or after
    ``measured_from_ms`` (the end of the warm-up)."""
    return [
        s.updated - WINDOW_MS
        for s in stats
        if s.updated >= WINDOW_MS and s.window_start >= measured_from_ms
    ]


def latency_summary(latencies: Sequence[int]) -> dict[str, int | None]:
    summary = {f"p{q}": percentile(latencies, q) for q in PERCENTILES}
    summary["max"] = summary.pop("p100")
    return summary


class KafkaWindows:
    """The Kafka sink's windows: each window's last record, its count and timestamp.

    Records are ``{"campaign_id", "window_start" (ms), "seen_count"}`` (the peers' and
    the hand-written Spark job's) or the job API's changelog records. The consumer reads
    ``read_committed``: the job API publishes each batch in a transaction.

    Keeps its consumer between calls: every ``read`` goes on from where the last one
    stopped, up to the end the topic has when it is called.
    """

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self._reader = consumer(kafka, **{"enable.partition.eof": False})
        self._parts = topic_partitions(kafka, topic)
        self._reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in self._parts])
        self._next = dict.fromkeys(self._parts, 0)
        self._latest: dict[tuple[str, int], WindowStat] = {}

    def read(self, timeout_s: float = 120) -> list[WindowStat]:
        ends = {}
        for part in self._parts:
            _, high = self._reader.get_watermark_offsets(
                TopicPartition(self.topic, part), timeout=self.kafka.timeout_s
            )
            if high > self._next[part]:
                ends[part] = high
        deadline = time.monotonic() + timeout_s
        while any(self._next[p] < end for p, end in ends.items()):
            if time.monotonic() > deadline:
                raise KafkaClusterError(f"reading {self.topic!r} took more than {timeout_s:.0f}s")
            for message in self._reader.consume(10_000, timeout=1.0):
                got, offset = message.partition(), message.offset()
                if message.error() is not None or got is None or offset is None:
                    continue
                self._next[got] = offset + 1
                if message.value() is None:
                    continue  # a tombstone (Flink's retraction of a count): no count
                record = json.loads(message.value() or b"{}")
                if "values" in record:
                    # The job API's changelog: ``window_start`` ISO-8601, the count in
                    # ``values`` (never null for a tumbling window).
                    start = datetime.fromisoformat(record["window_start"])
                    key = (str(record["campaign_id"]), int(start.timestamp() * 1000))
                    seen = int(record["values"]["seen_count"])
                else:
                    key = (str(record["campaign_id"]), int(record["window_start"]))
                    seen = int(record["seen_count"])
                # A window's records share a partition (keyed by campaign, or by campaign
                # and window), in order.
                self._latest[key] = WindowStat(key[0], key[1], seen, message.timestamp()[1])
            # A transaction's commit marker takes an offset no message has: the position
            # moves past it, and past aborted records.
            for at in self._reader.position([TopicPartition(self.topic, p) for p in ends]):
                if at.offset >= 0:
                    self._next[at.partition] = max(self._next[at.partition], at.offset)
        return sorted(self._latest.values(), key=lambda s: (s.window_start, s.campaign))

    def close(self) -> None:
        self._reader.close()


class JobWindows:
    """The windows of the YSB job on the job API (ysb/job.py) with the Redis sink: each
    window's count as the serving store holds it, and the time of its last write as the
    broker's append time of the window's last changelog record in ``topic``.

    The job writes a batch's changes to Redis first, then publishes them in one Kafka
    transaction: the append time is when the count reached the log, just after it
    reached the store. A read retries the topic a few times while it is behind the store
    (a transaction under way)."""

    def __init__(self, store: redis.Redis, job: str, output: str, changelog: KafkaWindows):
        self.store = store
        self.job = job
        self.output = output
        self.changelog = changelog

    def read(self) -> list[WindowStat]:
        counts = job_windows(self.store, self.job, self.output)
        for _ in range(20):
            logged = {(s.campaign, s.window_start): s for s in self.changelog.read()}
            if all(
                (got := logged.get(w)) is not None and got.seen_count == n
                for w, n in counts.items()
            ):
                break
            time.sleep(0.1)
        stats = [
            WindowStat(c, w, n, logged[(c, w)].time_updated if (c, w) in logged else 0)
            for (c, w), n in counts.items()
        ]
        return sorted(stats, key=lambda s: (s.window_start, s.campaign))


def write_outputs(
    out_dir: Path, result: RunResult, stats: Sequence[WindowStat], measured_from_ms: int
) -> list[Path]:
    """result.json, seen.txt and updated.txt (one line per window, in the same order),
    windows.csv (the same windows with their campaign and start) and latency.png."""
    write_json(out_dir / "result.json", result)
    (out_dir / "seen.txt").write_text("".join(f"{s.seen_count}\n" for s in stats))
    (out_dir / "updated.txt").write_text("".join(f"{s.updated}\n" for s in stats))
    (out_dir / "windows.csv").write_text(
        "campaign,window_start,seen_count,time_updated\n"
        + "".join(f"{s.campaign},{s.window_start},{s.seen_count},{s.time_updated}\n" for s in stats)
    )
    written = [out_dir / n for n in ("result.json", "seen.txt", "updated.txt", "windows.csv")]
    plot = out_dir / "latency.png"
    plot_latency(plot, result, stats, measured_from_ms)
    written.append(plot)
    return written


def plot_latency(
    path: Path, result: RunResult, stats: Sequence[WindowStat], measured_from_ms: int
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (over_time, dist) = plt.subplots(1, 2, figsize=(11, 4))
    title = f"YSB {result.engine}/{result.sink} at {result.rate_offered:,} events/s"
    fig.suptitle(title)
    if stats:
        origin = min(s.window_start for s in stats)
        xs = [(s.window_start - origin) / 1000 for s in stats if s.updated >= WINDOW_MS]
        ys = [s.updated - WINDOW_MS for s in stats if s.updated >= WINDOW_MS]
        over_time.scatter(xs, ys, s=6)
        if measured_from_ms > origin:
            over_time.axvline((measured_from_ms - origin) / 1000, color="grey", ls="--")
    over_time.set_xlabel("window start (s into the run)")
    over_time.set_ylabel("ms after the window closed")
    over_time.set_title("last update of each window")
    latencies = sorted(window_latencies(stats, measured_from_ms))
    if latencies:
        qs = [100 * (n + 1) / len(latencies) for n in range(len(latencies))]
        dist.plot(qs, latencies)
    dist.set_xlabel("percentile of windows")
    dist.set_ylabel("ms after the window closed")
    dist.set_title("distribution (after warm-up)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
