"""The ``count`` pipeline as a job on kappaflow's job API, built from its definition.

``kappaflow count start`` declares this job with the same public API a user's job has
(``import kappaflow as kf``): a source whose record type has the key, time and id fields
the definition names, its windows, and one aggregate, ``count``, written to the job's
changelog topic and the serving store. Parsing, dead letters, windows, corrections, late
events, dedup and exactly-once are the API's; ``count`` adds its CLI, its real-time
preview (realtime.py) and its views of the results (store.py, status.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import make_dataclass
from datetime import timedelta
from typing import Any

import kappaflow as kf
from kappaflow.counting.spec import CountSpec
from kappaflow.errors import ConflictingOptionsError

#: The job's one output: its topic is ``NAME.counts``, its windows ``kf:NAME:counts:``.
OUTPUT = "counts"


def event_type(spec: CountSpec) -> type:
    """The record type of a counting job's events: the key (a string or a number, counted
    as text), the event time, and the id if there is one (optional: an event without it
    is counted, never dropped as a repeat)."""
    if spec.time_field == spec.key_field:
        raise ConflictingOptionsError("--key and --time name the same field")
    fields: list[Any] = [(spec.key_field, str | int | float), (spec.time_field, kf.EventTime)]
    if spec.id_field is not None and spec.id_field not in (spec.key_field, spec.time_field):
        fields.append((spec.id_field, str | int | float | None, None))
    return make_dataclass("CountedEvent", fields)


def count_job(spec: CountSpec) -> Callable[[kf.Job], None]:
    """The ``build`` function of a counting job with the definition ``spec``."""
    record = event_type(spec)

    def build(job: kf.Job) -> None:
        events = job.source(
            spec.source,
            record,
            key=spec.key_field,
            time=spec.time_field,
            id=spec.id_field,
            watermark=spec.watermark_ms,
            allowed_lateness=spec.allowed_lateness_ms,
            start=spec.start,
        )
        if spec.session_gap_ms is not None:
            windows = events.window(session=timedelta(milliseconds=spec.session_gap_ms))
        elif spec.slide_ms is not None:
            size, slide = (timedelta(milliseconds=ms) for ms in (spec.size_ms, spec.slide_ms))
            windows = events.window(sliding=(size, slide))
        else:
            windows = events.window(tumbling=timedelta(milliseconds=spec.size_ms))
        counts = windows.aggregate(OUTPUT, by=spec.key_field, count=kf.count())
        counts.to(kf.topic(), kf.store())

    build.__qualname__ = f"count({spec.source})"
    return build
