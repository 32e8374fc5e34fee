"""``jobs diff``: the final values of a live job's windows against its shadow's.

Each windowed output's Kafka topic holds every change of a window's values (kinds
``provisional``, ``final``, ``correction``); a window's final values are those of its
last ``final`` or ``correction`` record. Per output both sides have, the windows (window
start and key) are compared aggregate by aggregate, over the aggregates both compute;
an aggregate only one side computes is reported as added or removed, not as a
difference. A window final on one side only counts as ``only_live`` (or
``only_shadow``) once the other side's watermark has passed the watermark it became
final under; before that it is ``pending``. With a shadow started from a savepoint, the
windows the live job made final up to the savepoint's batch are not in the shadow's
topic (it went on from there): they count as ``before_shadow``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kappaflow.errors import TopicNotFoundError
from kappaflow.jobs.manager import JobManager
from kappaflow.jobs.shadows import shadow_info
from kappaflow.settings import Settings

#: Kinds of record that carry a window's final values.
FINAL_KINDS = ("final", "correction")
SAMPLE = 5


@dataclass
class Finals:
    """One side's windows: the last final values of each (window start, key), the batch
    and watermark it first became final at, and the highest watermark its records show."""

    values: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    first: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    watermark: str = ""


def window_id(record: Mapping[str, Any], by: list[str]) -> tuple[str, str]:
    """A windowed record's window start and key (its key columns as JSON)."""
    return str(record["window_start"]), json.dumps([record.get(c) for c in by])


def read_finals(settings: Settings, topic: str, by: list[str]) -> Finals:
    """The finals of a windowed output's topic, as a read_committed consumer sees it."""
    from kappaflow.kafka.records import StartAt, read_records

    finals = Finals()
    try:
        messages = list(read_records(settings.kafka, topic, start=StartAt(beginning=True)))
    except TopicNotFoundError:
        return finals
    for message in messages:
        record = json.loads(message.value() or b"{}")
        if "window_start" not in record or "kind" not in record:
            continue
        finals.watermark = max(finals.watermark, str(record.get("watermark") or ""))
        if record["kind"] not in FINAL_KINDS:
            continue
        ident = window_id(record, by)
        finals.values[ident] = record.get("values") or {}
        finals.first.setdefault(ident, (int(record.get("batch") or 0), str(record["watermark"])))
    return finals


def same(a: Any, b: Any) -> bool:
    """Equal values; floats equal to the last bits a different summing order moves."""
    numbers = isinstance(a, int | float) and isinstance(b, int | float)
    if numbers and (isinstance(a, float) or isinstance(b, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def compare(
    live: Finals,
    shadow: Finals,
    aggregates: list[str],
    *,
    before_batch: int | None = None,
    sample: int = SAMPLE,
) -> dict[str, Any]:
    """Counts of the windows equal, different, final on one side only, pending and
    before the shadow; a sample of the differences and the first (by window, then key)."""
    counts = dict.fromkeys(
        ("equal", "different", "only_live", "only_shadow", "pending", "before_shadow"), 0
    )
    differences: list[dict[str, Any]] = []
    for ident in sorted(live.values.keys() | shadow.values.keys()):
        if ident in live.values and ident in shadow.values:
            left, right = live.values[ident], shadow.values[ident]
            differ = [a for a in aggregates if not same(left.get(a), right.get(a))]
            if not differ:
                counts["equal"] += 1
                continue
            counts["different"] += 1
            differences.append(
                {
                    "window_start": ident[0],
                    "key": json.loads(ident[1]),
                    "aggregates": differ,
                    "live": {a: left.get(a) for a in differ},
                    "shadow": {a: right.get(a) for a in differ},
                }
            )
        elif ident in live.values:
            batch, watermark = live.first[ident]
            if before_batch is not None and batch <= before_batch:
                counts["before_shadow"] += 1
            elif shadow.watermark >= watermark:
                counts["only_live"] += 1
            else:
                counts["pending"] += 1
        else:
            counts["only_shadow" if live.watermark >= shadow.first[ident][1] else "pending"] += 1
    return {
        "windows": counts,
        "first_difference": differences[0] if differences else None,
        "sample": differences[:sample],
    }


def windowed_outputs(plan: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The plan's windowed outputs that publish to a topic, by name."""
    found = {}
    for output in plan.get("outputs", []):
        topics = [s["kafka"] for s in output.get("sinks", []) if "kafka" in s]
        if "window" in output and topics:
            found[output["name"]] = {**output, "topic": topics[0]}
    return found


def job_diff(settings: Settings, name: str, *, sample: int = SAMPLE) -> dict[str, Any]:
    """Job ``name``'s windows against its shadow's, per output."""
    info = shadow_info(settings, name)
    jobs = JobManager(settings)
    shadow = str(info["job"])
    live_outputs = windowed_outputs(jobs.plan(name))
    shadow_outputs = windowed_outputs(jobs.plan(shadow))
    started = info["started_from"]
    outputs = []
    for output in sorted(live_outputs.keys() | shadow_outputs.keys()):
        if output not in shadow_outputs or output not in live_outputs:
            side = "live" if output in live_outputs else "shadow"
            outputs.append({"output": output, "status": "removed" if side == "live" else "added"})
            continue
        held, new = live_outputs[output], shadow_outputs[output]
        aggregates = {
            "common": sorted(held["aggregates"].keys() & new["aggregates"].keys()),
            "added": sorted(new["aggregates"].keys() - held["aggregates"].keys()),
            "removed": sorted(held["aggregates"].keys() - new["aggregates"].keys()),
        }
        live = read_finals(settings, held["topic"], held["by"])
        ahead = read_finals(settings, new["topic"], new["by"])
        before = None if started.get("replay") else started.get("batches", {}).get(output)
        found = compare(live, ahead, aggregates["common"], before_batch=before, sample=sample)
        compared: dict[str, Any] = {
            "output": output,
            "status": "compared",
            "live_topic": held["topic"],
            "shadow_topic": new["topic"],
            "aggregates": aggregates,
            **found,
        }
        outputs.append(compared)
    return {
        "job": name,
        "shadow": shadow,
        "shadow_state": str(jobs.get_state(shadow)),
        "app": info["app"],
        "started_from": started,
        "outputs": outputs,
    }
