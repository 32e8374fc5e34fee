"""Reading a job's state: per output, its open windows with their values, or a stateful
function's per-key state and timers, from the job's checkpoint or one of its savepoints.

The state is read through Spark's state data source, as of the last batch the query
committed, in a Spark session of the reader's own: a running job is not stopped or
slowed, and a batch it commits meanwhile is simply not seen. Each output's checkpoint
says what its state holds (``OUTPUT.plan.json``, jobs/plan.py) and, for a window, which
operator keeps it and its aggregates (streams/window_engine.py). What is read comes out
as plain rows (``dict``), one per window and key or per key of a stateful function:

- ``{"output", "kind": "window" | "session", "batch", "key", "window_start",
  "window_end", "values", "version", "final"}``: ``values`` are the aggregates' values as
  the output publishes them; ``final`` once the watermark passed the window's end;
- ``{"output", "kind": "stateful", "batch", "key", "state", "expires", "timers"}``: the
  function's state as its dataclass's fields, when the key expires and its timers (UTC).

A key is the JSON array of the output's key values; ``key=`` selects the rows whose key
is that array's text or its values joined by commas (``DE`` for ``["DE"]``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from kappaflow.errors import JobStateError, NoCommittedStateError
from kappaflow.jobs.manager import JobManager
from kappaflow.jobs.savepoints import find
from kappaflow.settings import Settings
from kappaflow.streams.aggregates import aggregate
from kappaflow.streams.jvm import jvm_engine
from kappaflow.streams.ops.arrow_ipc import table_from_ipc
from kappaflow.streams.ops.jvm_state import (
    SESSIONS,
    WINDOW_FINAL,
    WINDOW_KEYS,
    accumulators_version,
    read_sessions,
)
from kappaflow.streams.ops.windowing import values_json
from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.window_engine import checkpoint_engine, recorded_aggregates
from kappaflow.timeutil import from_epoch_ms, iso

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession

    from kappaflow.streams.aggregates import Aggregate

#: Beside each output's query folder in a checkpoint (jobs/plan.py).
PLAN_SUFFIX = ".plan.json"
#: The state variables of the Python window operators and of stateful functions.
PYTHON_WINDOW = "window"
STATEFUL = "state"


def job_state(
    settings: Settings,
    name: str,
    *,
    output: str | None = None,
    key: str | None = None,
    at: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Job ``name``'s state (every output's, or ``output``'s), from its checkpoint or
    from its savepoint ``at``; rows of ``key`` only, if given."""
    from kappaflow.spark.session import build_session

    JobManager(settings).get(name)  # JobNotFoundError for a job never started
    root = (
        str(find(settings, name, at).checkpoint)
        if at is not None
        else f"{settings.checkpoint_location.rstrip('/')}/{name}"
    )
    spark = build_session(settings, app_name=f"kappaflow:state:{name}")
    plans = output_plans(spark, root)
    if output is not None:
        if output not in plans:
            known = ", ".join(sorted(plans)) or "none"
            raise JobStateError(f"job {name!r} has no output {output!r} (outputs: {known})")
        plans = {output: plans[output]}
    for out, plan in plans.items():
        yield from output_state(spark, f"{root}/{out}", out, plan, key=key)


def output_plans(spark: SparkSession, root: str) -> dict[str, dict[str, Any]]:
    """Each output's plan in the checkpoint ``root``, by output name."""
    fs = HadoopFs(spark, root)
    return {
        entry.name.removesuffix(PLAN_SUFFIX): json.loads(fs.read_text(entry.name))
        for entry in sorted(fs.children(""), key=lambda e: e.name)
        if entry.name.endswith(PLAN_SUFFIX)
    }


def output_state(
    spark: SparkSession,
    checkpoint: str,
    output: str,
    plan: Mapping[str, Any],
    *,
    key: str | None = None,
) -> Iterator[dict[str, Any]]:
    """The state of one output's query (checkpoint ``checkpoint``, plan ``plan``) as of
    its last committed batch; nothing for an output that keeps none (records, joins)."""
    batch = committed_batch(spark, checkpoint)
    if plan.get("kind") == "windowed aggregate":
        if batch is None:
            raise NoCommittedStateError(f"output {output!r} has committed no batch yet")
        rows = _windows(spark, checkpoint, plan)
    elif plan.get("kind") == "stateful function":
        if batch is None:
            raise NoCommittedStateError(f"output {output!r} has committed no batch yet")
        rows = _stateful(spark, checkpoint)
    else:
        return
    for row in rows:
        if key is None or _key_matches(row["key"], key):
            yield {"output": output, "batch": batch, **row}


def committed_batch(spark: SparkSession, checkpoint: str) -> int | None:
    """The last batch a query's checkpoint has committed."""
    fs = HadoopFs(spark, checkpoint)
    batches = [int(e.name) for e in fs.children("commits") if e.name.isdigit()]
    return max(batches, default=None)


def _key_matches(found: list[Any], wanted: str) -> bool:
    return wanted in (json.dumps(found), ",".join(str(v) for v in found))


def _state(spark: SparkSession, checkpoint: str, variable: str) -> list[Row]:
    return (
        spark.read.format("statestore")
        .option("path", checkpoint)
        .option("stateVarName", variable)
        .load()
        .collect()
    )


def _windows(
    spark: SparkSession, checkpoint: str, plan: Mapping[str, Any]
) -> Iterator[dict[str, Any]]:
    session = bool(plan.get("session"))
    return window_state(spark, checkpoint, size_ms=None if session else int(plan["window_ms"]))


def window_state(
    spark: SparkSession,
    checkpoint: str,
    *,
    size_ms: int | None,
    aggregates: list[dict[str, Any]] | None = None,
) -> Iterator[dict[str, Any]]:
    """The windows a window query's checkpoint holds as of its last committed batch, as
    ``output_state``'s rows without ``output`` and ``batch``: windows of ``size_ms``, or
    sessions (None), whichever operator keeps them. Their aggregates are those the
    checkpoint records; ``aggregates`` (``describe_aggregates``'s list) stands in for a
    checkpoint that records none, for a reader that knows them (the counting job's)."""
    described = recorded_aggregates(spark, checkpoint) or aggregates
    if described is None:
        raise JobStateError(
            f"the window state in {checkpoint} was started before kappaflow recorded its "
            "aggregates: start the job again once (from its checkpoint) to read it"
        )
    if checkpoint_engine(spark, checkpoint) == "jvm":
        # Values are read, not folded: no input column.
        specs = [{**d, "input": -1} for d in described]
        decode = jvm_engine(spark).Aggregates.parse(json.dumps(specs))
        if size_ms is None:
            yield from _java_sessions(spark, checkpoint, decode, len(described))
        else:
            yield from _java_windows(spark, checkpoint, decode, size_ms)
    else:
        bound = [_aggregate(d) for d in described]
        names = [str(d["name"]) for d in described]
        if size_ms is None:
            yield from _python_sessions(spark, checkpoint, names, bound)
        else:
            yield from _python_windows(spark, checkpoint, names, bound, size_ms)


def _aggregate(described: Mapping[str, Any]) -> Aggregate:
    """A recorded aggregate, bound again (window_engine.record_aggregates)."""
    kind = str(described["kind"])
    options = {"quantiles": described["quantiles"]} if kind == "approx_quantiles" else {}
    found = aggregate(kind, described.get("column"), **options)
    # Bound to an integral column, a sum, min or max keeps integers; unbound, reals.
    return found.bind(pa.int64()) if described.get("integral") else found


def _window(
    kind: str, key: str, start: int, end: int, values: str, version: int, final: bool
) -> dict[str, Any]:
    return {
        "kind": kind,
        "key": json.loads(key),
        "window_start": iso(from_epoch_ms(start)),
        "window_end": iso(from_epoch_ms(end)),
        "values": json.loads(values),
        "version": version,
        "final": final,
    }


def _java_windows(
    spark: SparkSession, checkpoint: str, decode: Any, size_ms: int
) -> Iterator[dict[str, Any]]:
    """io.kappaflow.engine.Windows: per (window start, shard) a map from each key to its
    accumulators, and whether the window is final."""
    finals = {
        (int(row["key"]["_1"]), int(row["key"]["_2"])): bool(row["value"]["value"])
        for row in _state(spark, checkpoint, WINDOW_FINAL)
    }
    for row in _state(spark, checkpoint, WINDOW_KEYS):
        start, shard = int(row["key"]["_1"]), int(row["key"]["_2"])
        held = bytes(row["user_map_value"]["value"])
        yield _window(
            "window",
            row["user_map_key"]["value"],
            start,
            start + size_ms,
            str(decode.valuesJson(held)),
            accumulators_version(held),
            finals.get((start, shard), False),
        )


def _java_sessions(
    spark: SparkSession, checkpoint: str, decode: Any, aggregates: int
) -> Iterator[dict[str, Any]]:
    """io.kappaflow.engine.Sessions: per shard of keys, the sessions it holds."""
    for row in _state(spark, checkpoint, SESSIONS):
        held, _ = read_sessions(row["value"]["value"], aggregates)
        for s in held:
            values = str(decode.valuesJson(s.accumulators.raw))
            yield _window("session", s.key, s.start, s.end, values, s.version, s.final)


def _python_windows(
    spark: SparkSession, checkpoint: str, names: list[str], bound: list[Aggregate], size_ms: int
) -> Iterator[dict[str, Any]]:
    """The Python window operator: per window and shard, an Arrow table of every key's
    partials and version, and whether the window is final."""
    for row in _state(spark, checkpoint, PYTHON_WINDOW):
        held = table_from_ipc(row["value"]["partials"])
        start = int(row["key"]["window_start"])
        final = bool(row["value"]["final"])
        for key, values, version in zip(
            held["key"].to_pylist(),
            values_json(names, bound, held),
            held["version"].to_pylist(),
            strict=True,
        ):
            yield _window("window", key, start, start + size_ms, values, version, final)


def _python_sessions(
    spark: SparkSession, checkpoint: str, names: list[str], bound: list[Aggregate]
) -> Iterator[dict[str, Any]]:
    """The Python session operator: per shard of keys, an Arrow table of its sessions."""
    for row in _state(spark, checkpoint, SESSIONS):
        held = table_from_ipc(row["value"]["sessions"])
        yield from (
            _window("session", key, start, end, values, version, final)
            for key, start, end, values, version, final in zip(
                held["key"].to_pylist(),
                held["start"].to_pylist(),
                held["end"].to_pylist(),
                values_json(names, bound, held),
                held["version"].to_pylist(),
                held["final"].to_pylist(),
                strict=True,
            )
        )


def _stateful(spark: SparkSession, checkpoint: str) -> Iterator[dict[str, Any]]:
    """A stateful function's value state per key (streams/ops/stateful_run.py): its state
    as JSON, when the key expires and its pending timers (epoch ms, event time)."""
    for row in _state(spark, checkpoint, STATEFUL):
        value = row["value"]
        expires = value["expires"]
        yield {
            "kind": "stateful",
            "key": list(row["key"].asDict().values()),
            "state": json.loads(value["state"]),
            "expires": None if expires is None else iso(from_epoch_ms(int(expires))),
            "timers": [iso(from_epoch_ms(int(t))) for t in value["timers"] or []],
        }
