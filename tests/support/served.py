"""A job whose outputs the service's tests read back.

From the views on ``-P topic=...`` (a fixed set the tests know): views per page and 10 s
window (``pages``: the serving store, its changelog topic and the lake table ``pages``)
and each user's latest view (``last_view``: a keyed stream, the serving store and the
lake table ``last_view``). From the views on ``-P live=...``, which tests add to while
the job runs: ``clicks``, views per page and 10 s window, in the serving store and its
changelog topic. Views are JSON objects::

    {"user": "u1", "page": "/home", "at": "2026-11-23T10:00:03Z", "id": "v-1"}
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import kappaflow as kf


@dataclass
class View:
    user: str
    page: str
    at: kf.EventTime
    id: str


@dataclass
class LastView:
    user: str
    page: str
    at: datetime
    views: int
    #: Three views or more.
    regular: bool


@dataclass
class Seen:
    views: int = 0


@kf.stateful(state=Seen, output=LastView)
def last_view(
    key: tuple[Any, ...], events: list[View], ctx: kf.StateContext[Seen]
) -> Iterator[LastView]:
    ctx.state.views += len(events)
    last = max(events, key=lambda e: e.at)
    yield LastView(last.user, last.page, last.at, ctx.state.views, ctx.state.views >= 3)


def build(job: kf.Job) -> None:
    views = job.source(job.param("topic"), View, key="user", id="id", watermark="5s")
    pages = views.window(tumbling="10s").aggregate("pages", by="page", views=kf.count())
    pages.to(kf.store(), kf.topic(), kf.lake("pages"))
    latest = views.process(last_view, by="user")
    latest.to(kf.store(), kf.lake("last_view"), name="last_view")
    live = job.source(job.param("live"), View, key="user", id="id", watermark="5s")
    clicks = live.window(tumbling="10s").aggregate("clicks", by="page", views=kf.count())
    clicks.to(kf.store(), kf.topic())
