"""The YSB event generator: open loop, scheduled timestamps, several processes.

Event ``i`` of a process running at ``r`` events/s is due at ``start + i / r`` and
carries that scheduled time as its ``event_time``, whenever it is actually sent: a
generator that falls behind sends as fast as it can and the delay shows up as latency,
as in the original. Each process draws users, pages and ads uniformly from pools of its
own (100 users, 100 pages, its own 1000 ads, 10 per campaign), ad types and event types
uniformly from the original's lists.

One process runs in the caller (``generate``); ``run_processes`` splits a rate over
several processes of their own (``python -m kappaflow_bench.ysb.generator``), all on one
schedule, and adds up what they report.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from kappaflow.errors import ConfigError, JobError
from kappaflow.kafka.records import produce_with_retry
from kappaflow_bench.ysb.workload import AD_TYPES, EVENT_TAIL, EVENT_TYPES, PAGES, USERS, event_head

#: librdkafka settings for throughput. Records are small and unkeyed: large batches,
#: lz4, one broker acknowledgement (nothing here is replicated), no idempotence (its
#: sequence bookkeeping costs and a duplicate would show in the correctness check).
PRODUCER_CONFIG: dict[str, Any] = {
    "acks": 1,
    "enable.idempotence": False,
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "compression.type": "lz4",
    "delivery.report.only.error": True,
    "log_level": 0,
}
#: How far behind schedule before it is counted as falling behind (the original prints
#: "Falling behind by: N ms" past 100 ms).
BEHIND_MS = 100
#: Events sent between two polls of the producer's queue, at most.
CHUNK = 2_000


@dataclass
class GeneratorStats:
    """What one or more generator processes did."""

    rate: int
    events: int = 0
    seconds: float = 0.0
    #: Largest delay behind schedule at which an event was sent, milliseconds.
    max_behind_ms: int = 0
    #: Events sent more than BEHIND_MS late.
    events_behind: int = 0
    delivery_errors: int = 0
    processes: int = 1
    first_event_ms: int | None = None
    last_event_ms: int | None = None
    per_process: list[dict[str, Any]] = field(default_factory=list)

    @property
    def achieved_rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def _uuids(rng: random.Random, n: int) -> list[str]:
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]


def generate(
    client_config: dict[str, Any],
    topic: str,
    *,
    rate: int,
    duration_s: float,
    ads: Sequence[str],
    start_ns: int | None = None,
    seed: int | None = None,
) -> GeneratorStats:
    """Send ``rate * duration_s`` events on schedule from ``start_ns`` (default: now)."""
    if rate < 1:
        raise ConfigError("rate must be at least 1 event per second")
    rng = random.Random(seed)
    users, pages = _uuids(rng, USERS), _uuids(rng, PAGES)
    errors = [0]

    def on_error(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors[0] += 1

    producer = Producer({**client_config, **PRODUCER_CONFIG, "on_delivery": on_error})
    total = int(rate * duration_s)
    start = start_ns if start_ns is not None else time.time_ns()
    stats = GeneratorStats(rate=rate)
    choices = rng.choices
    sent = 0
    while sent < total:
        now = time.time_ns()
        due = min(total, (now - start) * rate // 1_000_000_000 + 1)
        if due <= sent:
            # Sleep until the next event is due; the original's granularity is 1 ms too.
            wait_ns = start + sent * 1_000_000_000 // rate - now
            time.sleep(max(wait_ns, 0) / 1e9)
            continue
        n = min(due - sent, CHUNK)
        behind_ms = (now - start - sent * 1_000_000_000 // rate) // 1_000_000
        if behind_ms > BEHIND_MS:
            stats.events_behind += n
        stats.max_behind_ms = max(stats.max_behind_ms, behind_ms)
        heads = [
            event_head(u, p, a, t, e)
            for u, p, a, t, e in zip(
                choices(users, k=n),
                choices(pages, k=n),
                choices(ads, k=n),
                choices(AD_TYPES, k=n),
                choices(EVENT_TYPES, k=n),
                strict=True,
            )
        ]
        for k, head in enumerate(heads, start=sent):
            value = (
                head + str((start + k * 1_000_000_000 // rate) // 1_000_000) + EVENT_TAIL
            ).encode()
            # A full queue drains fast at these rates: poll briefly, then send again.
            produce_with_retry(producer, topic, value, poll_s=0.005)
        sent += n
        producer.poll(0)
    remaining = producer.flush(60)
    stats.seconds = (time.time_ns() - start) / 1e9
    stats.events = sent - remaining
    stats.delivery_errors = errors[0] + remaining
    if total:
        stats.first_event_ms = start // 1_000_000
        stats.last_event_ms = (start + (total - 1) * 1_000_000_000 // rate) // 1_000_000
    return stats


def run_processes(
    client_config: dict[str, Any],
    topic: str,
    *,
    rate: int,
    duration_s: float,
    ads_per_process: Sequence[Sequence[str]],
    lead_s: float = 1.0,
) -> GeneratorStats:
    """``rate`` split over one process per ad set, all on one schedule starting in ``lead_s``.

    The processes are started, and their interpreters loaded, before the schedule begins.
    """
    count = len(ads_per_process)
    start_ns = time.time_ns() + int(lead_s * 1e9)
    procs = []
    for n, ads in enumerate(ads_per_process):
        share = rate // count + (1 if n < rate % count else 0)
        spec = {
            "client_config": client_config,
            "topic": topic,
            "rate": share,
            "duration_s": duration_s,
            "ads": list(ads),
            "start_ns": start_ns,
            "seed": n,
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "kappaflow_bench.ysb.generator"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(spec))
        proc.stdin.close()
        procs.append(proc)
    total = GeneratorStats(rate=rate, processes=count)
    try:
        for proc in procs:
            assert proc.stdout is not None
            out = proc.stdout.read()
            if proc.wait(timeout=duration_s + lead_s + 120) != 0 or not out.strip():
                raise JobError(f"generator process {proc.pid} failed (exit {proc.returncode})")
            part = json.loads(out)
            total.per_process.append(part)
            total.events += part["events"]
            total.seconds = max(total.seconds, part["seconds"])
            total.max_behind_ms = max(total.max_behind_ms, part["max_behind_ms"])
            total.events_behind += part["events_behind"]
            total.delivery_errors += part["delivery_errors"]
            for key, pick in (("first_event_ms", min), ("last_event_ms", max)):
                if part[key] is not None:
                    mine = getattr(total, key)
                    setattr(total, key, part[key] if mine is None else pick(mine, part[key]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    return total


def _child() -> int:
    spec = json.loads(sys.stdin.read())
    stats = generate(
        spec["client_config"],
        spec["topic"],
        rate=spec["rate"],
        duration_s=spec["duration_s"],
        ads=spec["ads"],
        start_ns=spec["start_ns"],
        seed=spec["seed"],
    )
    result = asdict(stats)
    result.pop("per_process")
    sys.stdout.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
