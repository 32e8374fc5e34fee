"""Windowed aggregates' partials, merges and results, on Arrow tables (no Spark).

Every aggregate is mergeable: folding the two halves of a group's events and merging
the two partials must give what folding all of them gives. That is what lets the fold
step reduce a micro-batch per (window, key) and the window state absorb it.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pyarrow as pa
import pytest

import kappaflow.streams.aggregates as kf
from kappaflow.errors import KappaflowError
from kappaflow.streams.aggregates import Aggregate
from kappaflow.streams.ops.folding import WEIGHT, input_name, partial_name, reduce_groups
from kappaflow.streams.ops.windowing import values_json


def raw(keys: list[str], values: list[Any], aggregates: list[Aggregate]) -> pa.Table:
    """Input rows as the fold step gets them: every aggregate reads ``values``."""
    columns: dict[str, Any] = {"key": keys, WEIGHT: [1] * len(keys)}
    for i, agg in enumerate(aggregates):
        if agg.column is not None:
            columns[input_name(i)] = values
    return pa.table(columns)


def results(partials: pa.Table, aggregates: list[Aggregate]) -> dict[str, list[Any]]:
    """Each key's results, one per aggregate."""
    order = partials["key"].to_pylist()
    found = [
        agg.results([partials[partial_name(i, p)].combine_chunks() for p in agg.partials()])
        for i, agg in enumerate(aggregates)
    ]
    return {key: [column[row] for column in found] for row, key in enumerate(order)}


def fold(table: pa.Table, aggregates: list[Aggregate]) -> pa.Table:
    return reduce_groups(table, ["key"], aggregates, raw=True)


def merge(*parts: pa.Table, aggregates: list[Aggregate]) -> pa.Table:
    return reduce_groups(pa.concat_tables(parts), ["key"], aggregates, raw=False)


INTS = [kf.count(), kf.sum("v"), kf.min("v"), kf.max("v"), kf.mean("v")]


def bound(aggregates: list[Aggregate], column_type: pa.DataType) -> list[Aggregate]:
    return [a.bind(column_type if a.column else None) for a in aggregates]


def test_merging_the_halves_equals_folding_the_whole() -> None:
    rng = random.Random(7)
    keys = [rng.choice("abc") for _ in range(400)]
    values = [rng.randint(-50, 50) if rng.random() > 0.1 else None for _ in range(400)]
    aggregates = bound(
        [*INTS, kf.approx_distinct("v"), kf.approx_quantiles("v", (0.5, 0.9))], pa.int64()
    )
    whole = fold(raw(keys, values, aggregates), aggregates)
    first = fold(raw(keys[:150], values[:150], aggregates), aggregates)
    second = fold(raw(keys[150:], values[150:], aggregates), aggregates)
    merged = merge(first, second, aggregates=aggregates)
    assert results(merged, aggregates) == results(whole, aggregates)
    # And against plain Python, nulls ignored except by count.
    for key, (n, total, low, high, avg, distinct, quantiles) in results(whole, aggregates).items():
        mine = [v for k, v in zip(keys, values, strict=True) if k == key and v is not None]
        assert n == keys.count(key)
        assert (total, low, high) == (sum(mine), min(mine), max(mine))
        assert isinstance(total, int) and isinstance(low, int)  # integral stays integral
        assert avg == pytest.approx(sum(mine) / len(mine))
        assert distinct == len(set(mine))  # exact while the sketch is small
        assert set(quantiles) == {"0.5", "0.9"}


def test_real_columns_give_floats() -> None:
    aggregates = bound(INTS, pa.float64())
    found = results(fold(raw(["a", "a"], [1.5, 2.0], aggregates), aggregates), aggregates)
    assert found == {"a": [2, 3.5, 1.5, 2.0, 1.75]}
    assert isinstance(found["a"][1], float)


def test_a_group_of_nulls_has_a_count_and_null_values() -> None:
    aggregates = bound([*INTS, kf.approx_distinct("v"), kf.approx_quantiles("v")], pa.float64())
    table = raw(["a", "a"], pa.array([None, None], pa.float64()), aggregates)
    found = results(fold(table, aggregates), aggregates)
    assert found == {"a": [2, None, None, None, None, 0, None]}


def test_approx_distinct_is_within_two_percent() -> None:
    aggregates = bound([kf.approx_distinct("user")], pa.string())
    users = [f"user-{i}" for i in range(10_000)]
    # Overlapping halves: 2,000 users in both, each value twice in its half.
    halves = [
        fold(raw(["k"] * 2 * len(part), part * 2, aggregates), aggregates)
        for part in (users[:6_000], users[4_000:])
    ]
    (estimate,) = results(merge(*halves, aggregates=aggregates), aggregates)["k"]
    assert abs(estimate - 10_000) <= 200


def test_approx_quantiles_are_close() -> None:
    aggregates = bound([kf.approx_quantiles("v", (0.1, 0.5, 0.99))], pa.float64())
    values = [float(v) for v in range(10_000)]
    random.Random(3).shuffle(values)
    parts = [
        fold(raw(["k"] * 2_500, values[i : i + 2_500], aggregates), aggregates)
        for i in range(0, 10_000, 2_500)
    ]
    (found,) = results(merge(*parts, aggregates=aggregates), aggregates)["k"]
    assert found.keys() == {"0.1", "0.5", "0.99"}
    for q, expected in ((0.1, 1_000), (0.5, 5_000), (0.99, 9_900)):
        assert abs(found[str(q)] - expected) <= 200, (q, found)


@pytest.mark.parametrize(
    ("make", "code", "says"),
    [
        (lambda: kf.aggregate("median", "v"), "KF711", "unknown aggregate 'median'"),
        (lambda: kf.sum(""), "KF712", "sum(): column must be a non-empty name, got ''"),
        (lambda: kf.mean(None), "KF712", "got None"),  # type: ignore[arg-type]
        (lambda: kf.aggregate("count", "v"), "KF712", "count() takes no column"),
        (lambda: kf.sum("name").bind(pa.string()), "KF713", "column 'name' is string"),
        (lambda: kf.approx_quantiles("v", (0.5, 1.0)), "KF714", "quantile 1.0 is not"),
        (lambda: kf.approx_quantiles("v", (0,)), "KF714", "quantile 0 is not"),
        (lambda: kf.approx_quantiles("v", (0.5, 0.5)), "KF714", "quantile 0.5 is given twice"),
        (lambda: kf.approx_quantiles("v", ()), "KF714", "non-empty"),
    ],
)
def test_bad_declarations_are_refused(make: Any, code: str, says: str) -> None:
    with pytest.raises(KappaflowError) as raised:
        make()
    assert raised.value.code == code
    assert says in str(raised.value)


def test_approx_distinct_takes_any_scalar_and_declarations_by_name_work() -> None:
    assert kf.aggregate("approx_distinct", "when").bind(pa.timestamp("ms")).column == "when"
    assert kf.aggregate("approx_quantiles", "v", quantiles=[0.25]) == kf.approx_quantiles(
        "v", (0.25,)
    )


def test_values_json_writes_what_json_dumps_writes() -> None:
    aggregates = [
        kf.count(),
        kf.max("x").bind(pa.float64()),
        kf.sum("n").bind(pa.int64()),
        kf.approx_quantiles("x", [0.5]).bind(pa.float64()),
    ]
    names = ["n", "top", 'the "sum"', "q"]
    xs = [1.5, 14.0, 1e-7, 1e16, -0.0, float("nan"), float("inf"), None, 2.5, 1 / 3]
    keys = [f"k{i}" for i in range(len(xs))]
    ints = [None if x is None else i - 3 for i, x in enumerate(xs)]
    table = raw(keys, xs, aggregates[:2]).append_column(input_name(2), pa.array(ints))
    table = table.append_column(input_name(3), pa.array(xs, pa.float64()))
    partials = reduce_groups(table, ["key"], aggregates, raw=True)
    found = results(partials, aggregates)
    want = [
        json.dumps(dict(zip(names, found[key], strict=True)), separators=(",", ":"))
        for key in partials["key"].to_pylist()
    ]
    assert values_json(names, aggregates, partials) == want
    one = values_json(names[:1], aggregates[:1], partials)
    assert one == [json.dumps({"n": 1}, separators=(",", ":"))] * len(xs)
