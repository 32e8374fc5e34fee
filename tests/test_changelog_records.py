"""A batch's changes as changelog records and store values, built a column at a time."""

import json

import pyarrow as pa

from kappaflow.streams.ops.windowing import output_table
from kappaflow.streams.output.backends import BatchAccount, MemoryStore, stored_windows
from kappaflow.streams.output.writer import changelog_records

MINUTE = 60_000
START = 1_795_000_000_000  # 2026-11-18T11:06:40Z


def changes(keys: list[str], **columns: list[object]) -> pa.Table:
    n = len(keys)
    defaults: dict[str, list[object]] = {
        "kind": ["provisional"] * n,
        "window_start": [START] * n,
        "window_end": [START + MINUTE] * n,
        "values": ['{"n":1}'] * n,
        "previous": [None] * n,
        "version": [1] * n,
        "watermark": [START] * n,
    }
    return output_table(n, key=keys, **{**defaults, **columns})


def test_records_name_each_key_column_and_carry_values_and_retraction() -> None:
    table = changes(
        ['["a \\"quoted\\", page",3]', "[null,-1.5]"],
        kind=["correction", "final"],
        values=['{"n":2,"mean":1.5}', '{"n":1}'],
        previous=['{"n":1,"mean":1.0}', '{"n":1}'],
        version=[3, 2],
        watermark=[0, START + MINUTE],
    )
    records = changelog_records("out", ("page", "size"), table, 7)
    assert [(topic, json.loads(key or b"")) for topic, key, _ in records] == [
        ("out", ['a "quoted", page', 3, START]),
        ("out", [None, -1.5, START]),
    ]
    first, second = (json.loads(value) for _, _, value in records)
    assert first == {
        "page": 'a "quoted", page',
        "size": 3,
        "window_start": "2026-11-18T11:06:40.000Z",
        "window_end": "2026-11-18T11:07:40.000Z",
        "values": {"n": 2, "mean": 1.5},
        "previous": {"n": 1, "mean": 1.0},
        "kind": "correction",
        "version": 3,
        "watermark": None,
        "batch": 7,
    }
    assert second["page"] is None and second["size"] == -1.5
    assert second["watermark"] == "2026-11-18T11:07:40.000Z"


def test_a_single_key_and_no_key() -> None:
    [(_, key, value)] = changelog_records("out", ("page",), changes(['"/"'.join("[]")]), 0)
    assert json.loads(key or b"") == ["/", START] and json.loads(value)["page"] == "/"
    [(_, key, value)] = changelog_records("out", (), changes(["[]"]), 0)
    assert json.loads(key or b"") == [START] and json.loads(value)["values"] == {"n": 1}
    assert changelog_records("out", ("page",), changes([]), 0) == []


def test_the_store_holds_final_values_and_drops_retracted_windows() -> None:
    table = changes(
        ['["a"]', '["b"]', '["c"]', '["d"]'],
        kind=["provisional", "final", "correction", "correction"],
        values=['{"n":1}', '{"n":2}', '{"n":3}', None],
        # c's correction comes after the watermark passed its window's end: final.
        watermark=[START, START + MINUTE, START + MINUTE, START + MINUTE],
    )
    keys, starts, held = stored_windows(table)
    assert keys == ['["a"]', '["b"]', '["c"]', '["d"]'] and starts == [str(START)] * 4
    assert [json.loads(h)["final"] if h else None for h in held] == [False, True, True, None]
    assert json.loads(held[0]) == {
        "end": START + MINUTE,
        "values": {"n": 1},
        "version": 1,
        "final": False,
    }

    store = MemoryStore()
    first = changes(['["d"]'], values=['{"n":9}'])
    store.apply("o", 0, first, BatchAccount({"events": 1}, START + MINUTE, {START: 1}))
    store.apply("o", 1, table, BatchAccount({"events": 4}, START, {START: 3, START + MINUTE: 2}))
    # The batch again, and a batch whose state forgot the window START.
    store.apply("o", 1, table, BatchAccount({"events": 4}, START + 2 * MINUTE, {START: 3}))
    store.apply("o", 2, changes([]), BatchAccount({"events": 0}, START, {START: -4}))
    assert sorted(k for k, _ in store.windows["o"]) == ['["a"]', '["b"]', '["c"]']
    assert store.stats["o"] == {"events": 5, "watermark": START + MINUTE}
    assert store.open["o"] == {START + MINUTE: 2}
