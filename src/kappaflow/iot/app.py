"""The whole IoT application as one job: the cleaning, training, scoring, alerting and
device-state jobs' streams declared on one job, run by one Spark driver.

On a cluster each job runs on its own (``docs/iot.md``), scaled and restarted apart; on
one small machine five drivers cost five JVMs, so this job runs them as one::

    kappaflow jobs start iot --app kappaflow.iot.app:build [-P score.dest=...]

A part's parameters are the job's parameters prefixed with the part's name
(``clean.source``, ``train.model``, ``score.models``, ``alerts.dest``,
``devices.events``, ...). ``-P parts=clean,score,alerts`` declares those parts only: the
others run as jobs of their own, or not at all (a scorer keeps scoring with the last
parameters it has while the trainer is stopped). The outputs keep their names
(``clean``, ``models``, ``scores``, ``alerts``, ``status``, ``last_values``); served keys
are under this job's name, and its dead letters go to one topic, ``JOB.dlq``.
"""

from __future__ import annotations

from collections.abc import Callable

import kappaflow as kf
from kappaflow.iot import alerts, clean, devices, score, train

#: The parts, in the order their streams are declared.
PARTS: dict[str, Callable[[kf.Job], None]] = {
    "clean": clean.build,
    "train": train.build,
    "score": score.build,
    "alerts": alerts.build,
    "devices": devices.build,
}


def build(job: kf.Job) -> None:
    chosen = [p.strip() for p in job.param("parts", ",".join(PARTS)).split(",") if p.strip()]
    unknown = [p for p in chosen if p not in PARTS]
    if unknown or not chosen:
        raise kf.InvalidParameterError(
            f"job {job.name!r}: parts {', '.join(unknown) or '(none)'} are not among "
            f"{', '.join(PARTS)}"
        )
    for part, build_part in PARTS.items():
        if part in chosen:
            build_part(job.scoped(part))
