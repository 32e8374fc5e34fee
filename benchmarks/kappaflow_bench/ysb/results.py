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
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from kappaflow.errors import KafkaClusterError
from kappaflow.kafka.clients import consumer
from kappaflow.kafka.topics import topic_partitions
from kappaflow.settings import KafkaSettings
from kappaflow_bench.report import percentile, write_json
from kappaflow_bench.ysb.store import WindowStat
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
                key = (str(record["campaign_id"]), int(record["window_start"]))
                # A campaign's records share a partition (keyed by campaign), in order.
                self._latest[key] = WindowStat(
                    key[0], key[1], int(record["seen_count"]), message.timestamp()[1]
                )
        return sorted(self._latest.values(), key=lambda s: (s.window_start, s.campaign))

    def close(self) -> None:
        self._reader.close()


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
