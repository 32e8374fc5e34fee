"""Reducing rows to partials per group, and the fold step before the window state.

The stateful operator costs per row it receives, and most events of a micro-batch repeat
a (window, key). The fold step (``Folder``, a stateless ``mapInArrow``) reduces them per
(window, shard, key, primary, source partition) to one row carrying the aggregates'
partials, how many events it stands for, how many of them the partials count, and the
range and the list of source offsets they came from (so that too-late events can be
read back and reported one by one).

With an id column, events are deduplicated per window: an event counts only the first
time its id is seen in the window. The fold cannot know which ids the window saw in
earlier batches, and a partial cannot take an event back out, so with ids it folds per id
as well (``id_hash`` is part of the group): the window state then keeps or drops each
id's row whole. Events without an id fold together and always count.

The fold hands the window state its rows packed (``packed``): per (window, shard), one
row holding that group's folded rows as Arrow IPC bytes, which the state unpacks
(``unpacked``). transformWithStateInPandas gives the state pandas frames, and pandas
holds an int64 column with a null as float64: a 64-bit id hash beside an event without
an id came out rounded to 53 bits, no longer the hash the window had kept for its first
copy, and a repeat counted again. Bytes cross pandas as they are.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kappaflow.streams.aggregates import Aggregate, Partial
from kappaflow.streams.ops.arrow_ipc import table_from_ipc, table_to_ipc

#: The fold's groups; ``id_hash`` is null without an id column.
GROUP = ["window_start", "shard", "key", "primary", "src_partition", "id_hash"]
#: 1 for an event the partials count, 0 for a duplicate within the batch.
WEIGHT = "_kf_weight"
#: Rows folded at once; bounds the Python worker's memory on a huge batch.
FOLD_ROWS = 500_000
#: What the fold step hands the window state: a group's folded rows, packed.
PACKED_GROUP = pa.schema(
    [("window_start", pa.int64()), ("shard", pa.int32()), ("rows", pa.binary())]
)
_ROW = "_kf_row"
_SQL = {
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.binary(): "BINARY",
    pa.string(): "STRING",
    pa.list_(pa.int64()): "ARRAY<BIGINT>",
}


def input_name(i: int) -> str:
    """The fold's input column of the ``i``-th aggregate (whatever the user's name)."""
    return f"in{i}"


def partial_name(i: int, part: Partial) -> str:
    # No leading underscore: Spark hands the stateful processor such columns renamed.
    return f"p{i}_{part.suffix}"


def partial_fields(aggregates: Sequence[Aggregate]) -> list[pa.Field]:
    return [
        pa.field(partial_name(i, part), part.type)
        for i, agg in enumerate(aggregates)
        for part in agg.partials()
    ]


def folded_schema(aggregates: Sequence[Aggregate]) -> pa.Schema:
    """The folded rows: what the fold step makes and the window state takes (packed)."""
    return pa.schema(
        [
            ("window_start", pa.int64()),
            ("shard", pa.int32()),
            ("key", pa.string()),
            ("primary", pa.bool_()),
            ("src_partition", pa.int32()),
            ("id_hash", pa.int64()),
            ("events", pa.int64()),
            ("counted", pa.int64()),
            ("first_offset", pa.int64()),
            ("last_offset", pa.int64()),
            ("offsets", pa.list_(pa.int64())),
            # A record that did not parse: why, and its bytes (null for events).
            ("reason", pa.string()),
            ("value", pa.binary()),
            *partial_fields(aggregates),
        ]
    )


def ddl(schema: pa.Schema) -> str:
    """``schema`` in Spark's DDL."""
    sql = {**_SQL, pa.int32(): "INT", pa.bool_(): "BOOLEAN"}
    return ", ".join(f"{field.name} {sql[field.type]}" for field in schema)


def reduce_groups(
    table: pa.Table,
    group: list[str],
    aggregates: Sequence[Aggregate],
    *,
    raw: bool,
    extra: Sequence[tuple[str, str]] = (),
) -> pa.Table:
    """One row per group of ``table``: the group columns, each ``extra`` hash aggregation
    (named ``column_function``) and the aggregates' partials.

    ``raw``: ``table`` holds input rows (``input_name`` columns and ``WEIGHT``), else
    partial rows (``partial_name`` columns) to merge.
    """
    specs: list[tuple[str, str]] = list(extra)
    sketches = False
    for i, agg in enumerate(aggregates):
        for part in agg.partials():
            function = part.fold if raw else part.merge
            if function is None:
                sketches = True
            else:
                specs.append((_source(i, agg, part, raw), function))
    specs = list(dict.fromkeys(specs))
    if sketches:
        table = table.append_column(_ROW, pa.array(np.arange(table.num_rows, dtype="int64")))
        specs.append((_ROW, "list"))
    grouped = table.group_by(group, use_threads=False).aggregate(specs)
    columns = {name: grouped[name] for name in group}
    columns.update({f"{c}_{f}": grouped[f"{c}_{f}"] for c, f in extra})
    rows = grouped[f"{_ROW}_list"].combine_chunks() if sketches else None
    for i, agg in enumerate(aggregates):
        for part in agg.partials():
            function = part.fold if raw else part.merge
            source = _source(i, agg, part, raw)
            if function is not None:
                columns[partial_name(i, part)] = grouped[f"{source}_{function}"].cast(part.type)
                continue
            assert rows is not None
            values = table[source].combine_chunks()
            blobs = [
                agg.fold_group(values.take(owned.values))
                if raw
                else agg.merge_group(values.take(owned.values).to_pylist())
                for owned in rows
            ]
            columns[partial_name(i, part)] = pa.array(blobs, part.type)
    return pa.table(columns)


def _source(i: int, agg: Aggregate, part: Partial, raw: bool) -> str:
    if not raw:
        return partial_name(i, part)
    return input_name(i) if agg.column is not None else WEIGHT


def packed(folded: pa.Table) -> pa.Table:
    """``folded`` rows (``folded_schema``) as PACKED_GROUP rows: one per (window_start,
    shard), holding that group's rows as the bytes of an Arrow IPC stream."""
    if not folded.num_rows:
        return PACKED_GROUP.empty_table()
    rows = folded.take(
        pc.sort_indices(folded, [("window_start", "ascending"), ("shard", "ascending")])
    )
    starts = rows["window_start"].to_numpy()
    shards = rows["shard"].to_numpy()
    edges = np.flatnonzero((np.diff(starts) != 0) | (np.diff(shards) != 0)) + 1
    bounds = [0, *edges.tolist(), rows.num_rows]
    firsts = bounds[:-1]
    return pa.table(
        {
            "window_start": pa.array(starts[firsts], pa.int64()),
            "shard": pa.array(shards[firsts], pa.int32()),
            "rows": pa.array(
                [table_to_ipc(rows.slice(a, b - a)) for a, b in itertools.pairwise(bounds)],
                pa.binary(),
            ),
        },
        schema=PACKED_GROUP,
    )


def unpacked(blobs: Iterable[bytes], schema: pa.Schema) -> pa.Table:
    """The folded rows (of ``schema``) that PACKED_GROUP rows' ``rows`` hold, in order."""
    tables = [table_from_ipc(blob) for blob in blobs]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables).cast(schema)


class Folder:
    """The ``mapInArrow`` function. Input columns: ``GROUP`` but ``key`` already the JSON
    text of the key, ``src_offset``, ``input_name(i)`` per aggregate with a column, and
    optionally ``reason`` and ``value`` (a record that did not parse, passed on whole).
    Output: PACKED_GROUP rows (``packed``) of what ``fold`` makes of them."""

    def __init__(self, aggregates: Sequence[Aggregate]) -> None:
        self.aggregates = list(aggregates)
        self.schema = folded_schema(self.aggregates)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pending: list[pa.RecordBatch] = []
        rows = 0
        for batch in batches:
            pending.append(batch)
            rows += batch.num_rows
            if rows >= FOLD_ROWS:
                yield from packed(self.fold(pa.Table.from_batches(pending))).to_batches()
                pending, rows = [], 0
        if pending:
            yield from packed(self.fold(pa.Table.from_batches(pending))).to_batches()

    def fold(self, table: pa.Table) -> pa.Table:
        """Events folded per group; records that did not parse (``reason``) one row each."""
        if "reason" not in table.column_names:
            return self._fold(table)
        dead = pc.is_valid(table["reason"])
        if not pc.any(dead).as_py():
            return self._fold(table)
        return pa.concat_tables(
            [self._fold(table.filter(pc.invert(dead))), self._unfolded(table.filter(dead))]
        )

    def _unfolded(self, table: pa.Table) -> pa.Table:
        n = table.num_rows
        offsets = table["src_offset"].combine_chunks()
        columns: dict[str, pa.Array | pa.ChunkedArray] = {
            "events": pa.array(np.zeros(n, dtype="int64")),
            "counted": pa.array(np.zeros(n, dtype="int64")),
            "first_offset": offsets,
            "last_offset": offsets,
            "offsets": pa.ListArray.from_arrays(np.arange(n + 1, dtype="int32"), offsets),
        }
        arrays = [
            table[f.name]
            if f.name in table.column_names and f.name not in columns
            else columns.get(f.name, pa.nulls(n, f.type))
            for f in self.schema
        ]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def _fold(self, table: pa.Table) -> pa.Table:
        weight = _first_of_each_id(table)
        table = table.append_column(WEIGHT, weight)
        counts = pc.greater(weight, 0)
        for i, agg in enumerate(self.aggregates):
            if agg.column is not None and pc.any(pc.invert(counts)).as_py():
                # A duplicate's value must not reach the partials.
                column = table[input_name(i)]
                masked = pc.if_else(counts, column, pa.nulls(len(column), column.type))
                table = table.set_column(
                    table.schema.get_field_index(input_name(i)), input_name(i), masked
                )
        extra = [
            ("src_offset", "count"),
            (WEIGHT, "sum"),
            ("src_offset", "min"),
            ("src_offset", "max"),
            ("src_offset", "list"),
        ]
        grouped = reduce_groups(table, GROUP, self.aggregates, raw=True, extra=extra)
        columns = {name: grouped[name] for name in GROUP}
        columns["events"] = grouped["src_offset_count"]
        columns["counted"] = grouped[f"{WEIGHT}_sum"]
        columns["first_offset"] = grouped["src_offset_min"]
        columns["last_offset"] = grouped["src_offset_max"]
        # Each event's own offset: a too-late event is read back from the source by it,
        # whatever the job's own filters did around it.
        columns["offsets"] = grouped["src_offset_list"]
        columns["reason"] = pa.nulls(grouped.num_rows, pa.string())
        columns["value"] = pa.nulls(grouped.num_rows, pa.binary())
        columns.update({f.name: grouped[f.name] for f in partial_fields(self.aggregates)})
        return pa.table(columns).cast(self.schema)


def _first_of_each_id(table: pa.Table) -> pa.Array:
    """1 for each event without an id or first with its id in its (window, shard), else 0."""
    n = table.num_rows
    ids = table["id_hash"]
    if ids.null_count == n:
        return pa.array(np.ones(n, dtype="int64"))
    rows = pa.array(np.arange(n, dtype="int64"))
    firsts = (
        pa.table({"w": table["window_start"], "s": table["shard"], "i": ids, "r": rows})
        .group_by(["w", "s", "i"], use_threads=False)
        .aggregate([("r", "min")])["r_min"]
    )
    first = pc.or_(pc.is_null(ids), pc.is_in(rows, value_set=firsts))
    return pc.cast(first, pa.int64())
