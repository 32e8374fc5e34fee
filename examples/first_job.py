"""Page views per minute: the job of docs/jobs.md, "Write your first job"."""

from dataclasses import dataclass

import kappaflow as kf


@dataclass
class Click:
    user: str
    page: str
    at: kf.EventTime


def build(job: kf.Job) -> None:
    clicks = job.source("clicks", Click, key="user", watermark="5s")
    views = clicks.window(tumbling="1m").aggregate(
        "views", by="page", views=kf.count(), users=kf.approx_distinct("user")
    )
    views.to(kf.topic(), kf.store())
