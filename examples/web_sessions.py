"""Web sessions: per visitor, page views closer than 30 minutes to the next form a visit.

Page views are JSON objects on the topic ``views`` (``-P topic=...`` names another)::

    {"view_id": "v-1", "visitor": "ada", "path": "/pricing", "seconds": 42,
     "at": "2026-11-23T10:00:03Z"}

Per visit: the views, the distinct pages and the seconds spent. A visit grows while its
visitor keeps coming back within the gap, and two visits a late view bridges become one:
the earlier visit's results are corrected and the later one is retracted (a correction
whose values are null). A visit is final once the watermark (1 minute behind the latest
view) passes its end; a view up to an hour later than that may still correct it or start
a visit of its own, one later still goes to the job's late topic. Run it with
``kappaflow jobs start web_sessions --app web_sessions:build`` from this folder.
"""

from __future__ import annotations

from dataclasses import dataclass

import kappaflow as kf


@dataclass
class View:
    view_id: str
    visitor: str
    path: str
    seconds: int
    at: kf.EventTime


def build(job: kf.Job) -> None:
    views = job.source(
        job.param("topic", "views"),
        View,
        key="visitor",
        id="view_id",
        watermark="1m",
        allowed_lateness="1h",
    )
    visits = views.window(session="30m").aggregate(
        "visits",
        by="visitor",
        views=kf.count(),
        pages=kf.approx_distinct("path"),
        seconds=kf.sum("seconds"),
    )
    visits.to(kf.topic(), kf.store())
