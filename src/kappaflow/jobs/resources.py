"""What a job on the job API creates: its output topics, commit markers, lake tables and
store keys, recorded in its directory (files.py) so that removing the job removes them."""

from __future__ import annotations

from kappaflow.jobs.files import Resources
from kappaflow.streams.job import Job
from kappaflow.streams.output.backends import commits_topic
from kappaflow.streams.runtime import lake_paths, output_topics


def job_resources(job: Job, lake_root: str, redis: bool) -> Resources:
    return Resources(
        topics=tuple(sorted({*output_topics(job), commits_topic(job.name)})),
        redis=redis,
        lakes=tuple(sorted(lake_paths(job, lake_root))),
    )
