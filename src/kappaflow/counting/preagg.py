"""Folding a micro-batch's events into one row per (window, key) before the state.

The stateful operator costs per row it receives, and most events of a batch repeat a
(window, key) pair. This stateless step (``mapInArrow``, Arrow in and out) folds them,
per Spark partition, into one row carrying how many events it stands for, the range of
source offsets they came from (so that too-late events can be found again and reported
one by one) and, with ``--id``, their id hashes for dedup. Records that cannot be
counted pass through one by one.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: What this step emits, and the stateful operator gets.
FOLDED_SCHEMA = (
    "window_start BIGINT, shard INT, key STRING, primary BOOLEAN, src_partition INT, "
    "events BIGINT, first_offset BIGINT, last_offset BIGINT, ids ARRAY<BIGINT>, "
    "reason STRING, value BINARY"
)
#: Rows folded at once; bounds the Python worker's memory on a huge batch.
FOLD_ROWS = 500_000

_GROUP = ["window_start", "shard", "key", "primary", "src_partition"]
_OUT = pa.schema(
    [
        ("window_start", pa.int64()),
        ("shard", pa.int32()),
        ("key", pa.string()),
        ("primary", pa.bool_()),
        ("src_partition", pa.int32()),
        ("events", pa.int64()),
        ("first_offset", pa.int64()),
        ("last_offset", pa.int64()),
        ("ids", pa.list_(pa.int64())),
        ("reason", pa.string()),
        ("value", pa.binary()),
    ]
)


class PreAggregator:
    """The ``mapInArrow`` function: input columns are those of ``_GROUP`` plus
    ``src_offset``, ``id_hash`` (null without an id), ``reason`` and ``value``."""

    def __init__(self, with_ids: bool) -> None:
        self.with_ids = with_ids

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return fold_batches(batches, self.with_ids)


def fold_batches(batches: Iterator[pa.RecordBatch], with_ids: bool) -> Iterator[pa.RecordBatch]:
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        pending.append(batch)
        rows += batch.num_rows
        if rows >= FOLD_ROWS:
            yield from fold(pa.Table.from_batches(pending), with_ids)
            pending, rows = [], 0
    if pending:
        yield from fold(pa.Table.from_batches(pending), with_ids)


def fold(table: pa.Table, with_ids: bool) -> Iterator[pa.RecordBatch]:
    dead = pc.is_valid(table["reason"])
    if pc.any(dead).as_py():
        yield from _unfolded_dead_letters(table.filter(dead))
        table = table.filter(pc.invert(dead))
    if table.num_rows == 0:
        return
    aggregates = [("src_offset", "count"), ("src_offset", "min"), ("src_offset", "max")]
    if with_ids:
        aggregates.append(("id_hash", "list"))
    folded = table.group_by(_GROUP, use_threads=False).aggregate(aggregates)
    n = folded.num_rows
    yield from _folded_rows(
        folded,
        events=folded["src_offset_count"],
        first_offset=folded["src_offset_min"],
        last_offset=folded["src_offset_max"],
        ids=_without_nulls(folded["id_hash_list"].combine_chunks())
        if with_ids
        else pa.nulls(n, pa.list_(pa.int64())),
        reason=pa.nulls(n, pa.string()),
        value=pa.nulls(n, pa.binary()),
    )


def _without_nulls(lists: pa.ListArray) -> pa.ListArray:
    """Each list without its null items (the events that have no id)."""
    flat = pc.list_flatten(lists)
    keep = pc.is_valid(flat)
    owners = pc.list_parent_indices(lists).filter(keep).to_numpy()
    sizes = np.bincount(owners, minlength=len(lists))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype("int32")
    return pa.ListArray.from_arrays(pa.array(offsets), flat.filter(keep))


def _unfolded_dead_letters(table: pa.Table) -> Iterator[pa.RecordBatch]:
    """Records that cannot be counted, one folded row each, with their reason and bytes."""
    n = table.num_rows
    yield from _folded_rows(
        table,
        events=pa.array([1] * n, pa.int64()),
        first_offset=table["src_offset"],
        last_offset=table["src_offset"],
        ids=pa.nulls(n, pa.list_(pa.int64())),
        reason=table["reason"],
        value=table["value"],
    )


def _folded_rows(
    groups: pa.Table, **columns: pa.Array | pa.ChunkedArray
) -> Iterator[pa.RecordBatch]:
    """Rows of FOLDED_SCHEMA: the ``_GROUP`` columns of ``groups``, then ``columns``."""
    yield from pa.table(
        {**{name: groups[name] for name in _GROUP}, **columns}, schema=_OUT
    ).to_batches()
