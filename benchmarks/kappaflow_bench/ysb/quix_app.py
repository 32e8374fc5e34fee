"""YSB on Quix Streams, the Python-native stream processing library, as a peer.

Run by ``kappaflow-bench ysb --engine quix`` in a virtual environment of its own
(``<state_dir>/engines/quix/venv``): Quix Streams pins an older confluent-kafka than
kappaflow. Reads its run's description as JSON on stdin.

The same job as the Spark one: parse, keep views, project, map the ad to its campaign
(the table read from Redis at start), re-key by campaign (Quix's ``group_by``, through
a repartition topic), count in 10-second tumbling event-time windows (state in RocksDB),
and every window update goes to Redis in the original layout (coalesced and written
every FLUSH_S by a flusher thread, like the original engines' 1-second flusher) or to
a Kafka topic.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from kappaflow_bench.ysb.store import WindowWriter, ad_campaigns, connect
from kappaflow_bench.ysb.workload import WINDOW_MS

FLUSH_S = 0.05
#: How late an event may be and still count (the windows' grace period).
GRACE_MS = 60_000


class Flusher:
    """Latest count per window, written to Redis every FLUSH_S by a thread of its own."""

    def __init__(self, redis_url: str) -> None:
        self.writer = WindowWriter(connect(redis_url))
        self._pending: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flusher", daemon=True)
        self._thread.start()

    def update(self, campaign: str, start: int, count: int) -> None:
        with self._lock:
            self._pending[(campaign, start)] = count

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        if pending:
            self.writer.write(
                ((c, w, n) for (c, w), n in pending.items()), time.time_ns() // 1_000_000
            )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.flush()


def main() -> int:
    from quixstreams import Application

    spec: dict[str, Any] = json.loads(sys.stdin.read())
    table = ad_campaigns(connect(spec["redis_url"]))
    client = dict(spec["client_config"])
    bootstrap = client.pop("bootstrap.servers")
    app = Application(
        broker_address=bootstrap,
        consumer_group=spec["group"],
        auto_offset_reset="earliest",
        state_dir=spec["state_dir"],
        commit_interval=1.0,
        loglevel="WARNING",
        consumer_extra_config=client,
        producer_extra_config=client,
    )
    source = app.topic(
        spec["source"],
        value_deserializer="json",
        timestamp_extractor=lambda value, _headers, _ts, _type: int(value["event_time"]),
    )
    sdf = app.dataframe(source)
    sdf = sdf.filter(lambda event: event["event_type"] == "view")
    sdf = sdf.apply(lambda event: {"ad_id": event["ad_id"], "event_time": event["event_time"]})
    sdf = sdf.apply(lambda view: table.get(view["ad_id"]))
    sdf = sdf.filter(lambda campaign: campaign is not None)
    sdf = sdf.group_by(lambda campaign: campaign, name="campaign")
    sdf = sdf.tumbling_window(WINDOW_MS, grace_ms=GRACE_MS).count().current()
    flusher: Flusher | None = None
    if spec["sink"] == "kafka":
        out = app.topic(spec["dest"], value_serializer="json", key_serializer="str")
        sdf = sdf.apply(
            lambda w, key, _ts, _headers: {
                "campaign_id": key,
                "window_start": w["start"],
                "window_end": w["end"],
                "seen_count": w["value"],
            },
            metadata=True,
        )
        sdf.to_topic(out, key=lambda record: record["campaign_id"])
    else:
        sink = flusher = Flusher(spec["redis_url"])
        sdf.update(
            lambda w, key, _ts, _headers: sink.update(key, w["start"], w["value"]),
            metadata=True,
        )

    def stop(_signum: int, _frame: FrameType | None) -> None:
        app.stop()

    signal.signal(signal.SIGTERM, stop)
    print("quix app running", flush=True)
    app.run()
    if flusher is not None:
        flusher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
