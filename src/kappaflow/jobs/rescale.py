"""Rescaling: a stopped job's parallelism (its shuffle partitions, which are its state's
partitions) changed through a savepoint, its state redistributed by key.

Spark pins a query's shuffle partitions in its checkpoint: each batch's offset log entry
holds ``spark.sql.shuffle.partitions``, a restart takes it from there, and each state
store partition holds the keys that hash to it. Spark 4.2+ rewrites a stopped query's
state for another count offline (``StreamingCheckpointManager.repartition``): it reads
the state of the last committed batch N through the state data source, repartitions it
by key and writes it as a batch N+1 of its own, committed, with the new count in its
offset log entry and operator metadata. The batch reads nothing and runs no sink; the
query goes on from N+2 with the new count.

``rescale``:

1. refuses a job in real-time mode, a count below 1 and the count the job has (KF911-913),
   and a running job unless asked to stop it (KF910);
2. stops the job if asked (its batch under way ends first);
3. refuses a checkpoint whose last batch did not finish (KF914): Spark would have to skip
   it, and its input, read again in a batch of another id and partitioning, would be
   written twice by the sinks that wrote part of it;
4. takes a savepoint of the stopped job (``rescale-<time>``), the way back;
5. repartitions a copy of the checkpoint, query by query (a query without state keeps
   its count), and swaps it in by renames: the job's checkpoint is at all times the old
   one or the new one;
6. starts the job again if it stopped it.

What kappaflow keeps per task partition follows without a change: the sinks' markers of
a batch's partitions (Kafka's ``OUTPUT#pN``, PostgreSQL's marker rows) are read only for
the batch under way, after the markers of the last batch committed; every batch up to N
is committed, N+1 writes nothing, and N+2, the first with the new count, has no marker
yet. The first batch of a run fences the transactional ids of its partitions and eight
more, so a count that shrinks fences the ids it no longer uses (none holds a
transaction open after a clean stop). The events read are measured from the offset log,
whose entry N+1 repeats N's offsets.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from kappaflow.errors import (
    InvalidPartitionsError,
    RescaleError,
    RescaleNoChangeError,
    RescaleUnfinishedBatchError,
    RescaleUnsupportedError,
    SavepointUnsupportedError,
)
from kappaflow.jobs.files import PLAN
from kappaflow.jobs.manager import JobManager
from kappaflow.jobs.savepoints import Savepoint, checkpoint_path, take_here
from kappaflow.settings import Settings
from kappaflow.spark.checkpoint import shuffle_partitions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class Rescaled:
    """What a rescale did: the savepoint taken before, each output's count before and
    after (equal for an output without state), and whether the job was started again."""

    job: str
    partitions: int
    savepoint: Savepoint
    before: dict[str, int | None]
    after: dict[str, int | None]
    restarted: bool = False
    unchanged: list[str] = field(default_factory=list)


def query_partitions(query: Path) -> int | None:
    """The shuffle partitions of a query's last planned batch (spark/checkpoint.py)."""
    return shuffle_partitions(query)


def _queries(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return [d for d in sorted(root.iterdir()) if (d / "offsets").is_dir()]


def _last(log: Path) -> int | None:
    batches = [int(p.name) for p in log.iterdir() if p.name.isdigit()] if log.is_dir() else []
    return max(batches, default=None)


def _has_state(query: Path) -> bool:
    state = query / "state"
    return state.is_dir() and any(d.name.isdigit() for d in state.iterdir())


def rescale(
    settings: Settings,
    name: str,
    count: int,
    *,
    label: str | None = None,
    restart: bool = False,
    spark: SparkSession | None = None,
) -> Rescaled:
    """Change job ``name``'s shuffle and state partitions to ``count`` (see the module's
    docstring); ``restart``: a running job is stopped first and started again after."""
    jobs = JobManager(settings)
    record = jobs.get(name)
    if record.real_time:
        raise RescaleUnsupportedError(
            f"job {name!r} runs in real-time mode, whose state partitions are its source's "
            "partitions: it is not rescaled"
        )
    if count < 1:
        raise InvalidPartitionsError(f"--partitions must be 1 or more, not {count}")
    home = jobs.job_dir(name)
    if not (home / PLAN).exists():
        raise RescaleUnsupportedError(
            f"job {name!r} is not a job on the job API (started with --app): only those "
            "are rescaled"
        )
    root = checkpoint_path(settings, name)
    queries = _queries(root)
    before = {q.name: query_partitions(q) for q in queries}
    if not any(n is not None for n in before.values()):
        raise SavepointUnsupportedError(
            f"job {name!r} has no checkpoint yet ({root}): let it run a batch first"
        )
    stateful = [q for q in queries if _has_state(q)]
    if not stateful:
        raise RescaleUnsupportedError(
            f"job {name!r} keeps no state: its outputs have no partitions to rescale"
        )
    if all(before[q.name] == count for q in stateful):
        raise RescaleNoChangeError(f"job {name!r} already has {count} partitions")
    running = jobs.is_running(name)
    if running and not restart:
        raise RescaleError(
            f"job {name!r} is running: stop it first (`kappaflow jobs stop {name}`), or give "
            "--restart to stop it, rescale it and start it again"
        )
    if running:
        jobs.stop(name)
    try:
        # Every query's last planned batch must be committed (step 3 of the docstring).
        for query in queries:
            planned, committed = _last(query / "offsets"), _last(query / "commits")
            if planned != committed:
                raise RescaleUnfinishedBatchError(
                    f"job {name!r} output {query.name!r}: batch {planned} did not finish "
                    f"(the last committed is {committed}); start the job so that it runs "
                    "that batch again, stop it, and rescale it then"
                )
        taken = take_here(
            settings, name, label or datetime.now(UTC).strftime("rescale-%Y%m%dT%H%M%S%fZ")
        )
        changing = [q for q in stateful if before[q.name] != count]
        try:
            _repartition(settings, name, root, [q.name for q in changing], count, spark)
        except BaseException:
            # The checkpoint is as it was: the savepoint of it is not needed.
            shutil.rmtree(taken.path, ignore_errors=True)
            raise
    except BaseException:
        if running:
            _start_again(jobs, name)
        raise
    after = {q.name: query_partitions(q) for q in _queries(root)}
    if running:
        _start_again(jobs, name)
    return Rescaled(
        job=name,
        partitions=count,
        savepoint=taken,
        before=before,
        after=after,
        restarted=running,
        unchanged=sorted(q.name for q in queries if q not in stateful),
    )


def _repartition(
    settings: Settings,
    name: str,
    root: Path,
    queries: list[str],
    count: int,
    spark: SparkSession | None,
) -> None:
    """Repartition ``queries`` of the checkpoint at ``root`` in a copy beside it, then
    swap the copy in."""
    from py4j.protocol import Py4JJavaError
    from pyspark.sql import SparkSession

    from kappaflow.jobs.restore import relocate
    from kappaflow.spark.session import build_session

    incoming = root.parent / f".{name}.rescaling"
    outgoing = root.parent / f".{name}.rescaled"
    for scratch in (incoming, outgoing):
        shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(root, incoming)
    old, new = str(root.absolute()), str(incoming.absolute())
    # The copy names its own schema files (restore.relocate), and back once it is in place.
    relocate(incoming, old, new)
    given = spark or SparkSession.getActiveSession()
    session = given or build_session(settings, app_name=f"kappaflow:rescale:{name}")
    try:
        manager = session._streamingCheckpointManager
        for query in queries:
            try:
                manager.repartition(str(incoming / query), count, enforce_exactly_once_sink=True)
            except Py4JJavaError as exc:
                reason = str(exc.java_exception.toString()).splitlines()[0]
                raise RescaleUnsupportedError(
                    f"Spark could not repartition the state of job {name!r} output "
                    f"{query!r}: {reason}"
                ) from None
    except BaseException:
        shutil.rmtree(incoming, ignore_errors=True)
        raise
    finally:
        if given is None:
            session.stop()
    relocate(incoming, new, old)
    root.rename(outgoing)
    incoming.rename(root)
    shutil.rmtree(outgoing, ignore_errors=True)


def _start_again(jobs: JobManager, name: str) -> None:
    record = jobs.get(name)
    jobs.start(
        name,
        record.pipeline,
        record.params,
        overrides=record.overrides,
        config_file=Path(record.config_file) if record.config_file else None,
    )
