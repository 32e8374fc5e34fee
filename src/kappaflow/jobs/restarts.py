"""When a job's failed queries start again from their checkpoints instead of failing the
job: the failures a restart cures, and how many restarts a job gets."""

from __future__ import annotations

from typing import Any

#: Failures a job's queries restart from their checkpoints after, rather than fail the
#: job: Spark gives a Python process it starts ten seconds, fixed, to connect back, which
#: several starting at once on a busy machine can miss. A restart runs the batch again,
#: and the sinks' commits make that change nothing.
TRANSIENT = ("Python worker failed to connect back",)
#: Restarts a job gets before a failure fails it, and the pause before each.
MAX_RESTARTS = 3
RESTART_PAUSE_S = 5.0


def failures(queries: list[Any]) -> list[str]:
    """The exceptions of the queries that stopped with one, as text."""
    return [str(e) for q in queries if not q.isActive and (e := q.exception())]


def restartable(failed: list[str]) -> bool:
    """Whether some query failed, and every failed one for a reason a restart cures."""
    return bool(failed) and all(any(t in text for t in TRANSIENT) for text in failed)
