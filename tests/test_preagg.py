"""Folding events per (window, key): counts, offsets and id hashes survive, dead rows pass."""

from __future__ import annotations

import pyarrow as pa

from kappaflow.counting.preagg import PreAggregator


def batch(rows: list[tuple[int, str | None, int, int | None, str | None]]) -> pa.RecordBatch:
    """(window_start, key, offset, id_hash, reason) rows of partition 0, all primary."""
    return pa.RecordBatch.from_pydict(
        {
            "window_start": pa.array([r[0] for r in rows], pa.int64()),
            "shard": pa.array([0 if r[4] is None else -1 for r in rows], pa.int32()),
            "key": pa.array([r[1] for r in rows], pa.string()),
            "primary": pa.array([True] * len(rows)),
            "src_partition": pa.array([0] * len(rows), pa.int32()),
            "src_offset": pa.array([r[2] for r in rows], pa.int64()),
            "id_hash": pa.array([r[3] for r in rows], pa.int64()),
            "reason": pa.array([r[4] for r in rows], pa.string()),
            "value": pa.array([b"bad" if r[4] else None for r in rows], pa.binary()),
        }
    )


def test_fold_counts_per_window_and_key() -> None:
    rows = [
        (0, "a", 0, 11, None),
        (0, "a", 1, None, None),
        (0, "b", 2, 12, None),
        (60_000, "a", 3, 13, None),
        (0, "a", 4, 11, None),
        (-1, None, 5, None, "not valid JSON"),
    ]
    folded = pa.Table.from_batches(
        list(PreAggregator(with_ids=True)(iter([batch(rows[:3]), batch(rows[3:])])))
    )
    by_group = {(r["window_start"], r["key"]): r for r in folded.to_pylist() if r["reason"] is None}
    assert set(by_group) == {(0, "a"), (0, "b"), (60_000, "a")}
    a = by_group[(0, "a")]
    assert a["events"] == 3
    assert (a["first_offset"], a["last_offset"]) == (0, 4)
    assert sorted(a["ids"]) == [11, 11]  # the event without an id has no hash; dups stay
    assert by_group[(0, "b")]["ids"] == [12]
    dead = [r for r in folded.to_pylist() if r["reason"] is not None]
    assert dead == [
        {
            "window_start": -1,
            "shard": -1,
            "key": None,
            "primary": True,
            "src_partition": 0,
            "events": 1,
            "first_offset": 5,
            "last_offset": 5,
            "ids": None,
            "reason": "not valid JSON",
            "value": b"bad",
        }
    ]
    assert sum(r["events"] for r in folded.to_pylist()) == len(rows)


def test_fold_without_ids_carries_none() -> None:
    folded = pa.Table.from_batches(
        list(
            PreAggregator(with_ids=False)(
                iter([batch([(0, "a", 7, 1, None), (0, "a", 9, 2, None)])])
            )
        )
    )
    assert folded.to_pylist()[0]["ids"] is None
    assert folded.to_pylist()[0]["events"] == 2
