"""Windowed aggregates users declare: ``count()``, ``sum("amount")``, ``approx_distinct(...)``.

Each aggregate is mergeable: it reduces a group of events to *partials* (a few Arrow
columns: a sum, a count, a serialized sketch), partials of two groups merge into the
partials of their union, and the result a window reports is computed from the partials.
The fold step reduces a micro-batch's events per (window, key) to partials, the window
state keeps one row of partials per key and merges each batch into it (windowing.py), so
neither ever holds the events themselves.

Vector work is pyarrow's hash aggregation (``Partial.fold`` and ``Partial.merge`` name
its functions); only the sketches (Apache DataSketches: HLL, KLL) loop in Python, once
per group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import datasketches as ds
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kappaflow.errors import (
    AggregateColumnError,
    NonNumericColumnError,
    QuantilesError,
    UnknownAggregateError,
)

#: HLL's accuracy: 2**12 buckets, about 1.6% relative error.
HLL_LG_K = 12
#: KLL's accuracy: k=200 ranks within about 1.65%.
KLL_K = 200


@dataclass(frozen=True)
class Partial:
    """One partial column: its name suffix, Arrow type and how it folds and merges.

    ``fold`` is the pyarrow hash aggregation over the input column (count's input is the
    events' weight, 1 per event that counts); ``merge`` the one over partials. None for
    both: the aggregate computes it per group in Python (``fold_group``, ``merge_group``).
    """

    suffix: str
    type: pa.DataType
    fold: str | None
    merge: str | None


@dataclass(frozen=True)
class Aggregate:
    """An aggregate over ``column`` (None: over events, for count)."""

    kind: ClassVar[str]
    #: Whether the column must be numeric.
    numeric: ClassVar[bool] = True
    column: str | None

    def partials(self) -> tuple[Partial, ...]:
        raise NotImplementedError

    def bind(self, column_type: pa.DataType | None) -> Aggregate:
        """This aggregate for a column of ``column_type``: checks it, and lets integral
        sums, minima and maxima stay integers."""
        if self.numeric and self.column is not None:
            assert column_type is not None
            if not (pa.types.is_integer(column_type) or _is_real(column_type)):
                raise NonNumericColumnError(
                    f"{self.kind}({self.column!r}): column {self.column!r} is "
                    f"{column_type}, not a number"
                )
        return self

    def results(self, partials: Sequence[pa.Array]) -> list[Any]:
        """The JSON value per row of ``partials`` (one array per ``Partial``)."""
        raise NotImplementedError

    def fold_group(self, values: pa.Array) -> bytes:
        """A sketch's partial of one group's non-null values."""
        raise NotImplementedError

    def merge_group(self, blobs: list[bytes | None]) -> bytes:
        """Sketch partials merged into one."""
        raise NotImplementedError


def _is_real(column_type: pa.DataType) -> bool:
    return bool(pa.types.is_floating(column_type) or pa.types.is_decimal(column_type))


def _number(value: Any) -> Any:
    """A JSON number: None for null, NaN and infinities (JSON has none of them)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


@dataclass(frozen=True)
class Count(Aggregate):
    kind = "count"

    def partials(self) -> tuple[Partial, ...]:
        return (Partial("n", pa.int64(), "sum", "sum"),)

    def results(self, partials: Sequence[pa.Array]) -> list[Any]:
        return [n or 0 for n in partials[0].to_pylist()]


@dataclass(frozen=True)
class _Extreme(Aggregate):
    """sum, min and max: one partial of the column's own kind of number."""

    integral: bool = False

    def bind(self, column_type: pa.DataType | None) -> Aggregate:
        super().bind(column_type)
        return replace(self, integral=pa.types.is_integer(column_type))

    def partials(self) -> tuple[Partial, ...]:
        number = pa.int64() if self.integral else pa.float64()
        return (Partial(self.kind, number, self.kind, self.kind),)

    def results(self, partials: Sequence[pa.Array]) -> list[Any]:
        return [_number(v) for v in partials[0].to_pylist()]


@dataclass(frozen=True)
class Sum(_Extreme):
    kind = "sum"


@dataclass(frozen=True)
class Min(_Extreme):
    kind = "min"


@dataclass(frozen=True)
class Max(_Extreme):
    kind = "max"


@dataclass(frozen=True)
class Mean(Aggregate):
    kind = "mean"

    def partials(self) -> tuple[Partial, ...]:
        return (
            Partial("sum", pa.float64(), "sum", "sum"),
            Partial("n", pa.int64(), "count", "sum"),
        )

    def results(self, partials: Sequence[pa.Array]) -> list[Any]:
        total, n = partials[0].to_pylist(), partials[1].to_pylist()
        return [
            _number(s / c) if c and s is not None else None for s, c in zip(total, n, strict=True)
        ]


@dataclass(frozen=True)
class ApproxDistinct(Aggregate):
    """Distinct values, estimated by an HLL sketch of the values (strings hashed as text,
    numbers as numbers, anything else as its text form)."""

    kind = "approx_distinct"
    numeric = False

    def partials(self) -> tuple[Partial, ...]:
        return (Partial("hll", pa.binary(), None, None),)

    def fold_group(self, values: pa.Array) -> bytes:
        sketch = ds.hll_sketch(HLL_LG_K)
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
            values = pc.cast(values, pa.string())
        for value in values.drop_null().to_pylist():
            sketch.update(value)
        return bytes(sketch.serialize_compact())

    def merge_group(self, blobs: list[bytes | None]) -> bytes:
        union = ds.hll_union(HLL_LG_K)
        for blob in blobs:
            if blob:
                union.update(ds.hll_sketch.deserialize(blob))
        return bytes(union.get_result().serialize_compact())

    def results(self, partials: Sequence[pa.Array]) -> list[Any]:
        return [
            round(ds.hll_sketch.deserialize(blob).get_estimate()) if blob else 0
            for blob in partials[0].to_pylist()
        ]


@dataclass(frozen=True)
class ApproxQuantiles(Aggregate):
    """Quantiles of the values, estimated by a KLL sketch."""

    kind = "approx_quantiles"
    quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)

    def partials(self) -> tuple[Partial, ...]:
        return (Partial("kll", pa.binary(), None, None),)

    def fold_group(self, values: pa.Array) -> bytes:
        sketch = ds.kll_doubles_sketch(KLL_K)
        numbers = pc.cast(values.drop_null(), pa.float64()).to_numpy(zero_copy_only=False)
        sketch.update(np.ascontiguousarray(numbers[~np.isnan(numbers)]))
        return bytes(sketch.serialize())

    def merge_group(self, blobs: list[bytes | None]) -> bytes:
        sketch = ds.kll_doubles_sketch(KLL_K)
        for blob in blobs:
            if blob:
                sketch.merge(ds.kll_doubles_sketch.deserialize(blob))
        return bytes(sketch.serialize())

    def results(self, partials: Sequence[pa.Array]) -> list[Any]:
        out: list[Any] = []
        for blob in partials[0].to_pylist():
            sketch = ds.kll_doubles_sketch.deserialize(blob) if blob else None
            if sketch is None or sketch.is_empty():
                out.append(None)
                continue
            found = sketch.get_quantiles(list(self.quantiles))
            out.append({str(q): _number(v) for q, v in zip(self.quantiles, found, strict=True)})
        return out


KINDS: dict[str, type[Aggregate]] = {
    cls.kind: cls for cls in (Count, Sum, Min, Max, Mean, ApproxDistinct, ApproxQuantiles)
}


def _column(kind: str, column: object) -> str:
    if not isinstance(column, str) or not column.strip():
        raise AggregateColumnError(f"{kind}(): column must be a non-empty name, got {column!r}")
    return column


def count() -> Aggregate:
    """How many events (each distinct id once, with an id column)."""
    return Count(None)


# sum, min and max shadow the builtins in this module on purpose: kf.sum("x") reads as
# users expect. Nothing below them uses the builtins.
def sum(column: str) -> Aggregate:
    """The sum of ``column``'s values (null when it has none)."""
    return Sum(_column("sum", column))


def min(column: str) -> Aggregate:
    """The least of ``column``'s values (null when it has none)."""
    return Min(_column("min", column))


def max(column: str) -> Aggregate:
    """The greatest of ``column``'s values (null when it has none)."""
    return Max(_column("max", column))


def mean(column: str) -> Aggregate:
    """The mean of ``column``'s values (null when it has none)."""
    return Mean(_column("mean", column))


def approx_distinct(column: str) -> Aggregate:
    """About how many distinct values ``column`` has (HLL, ~1.6% relative error)."""
    return ApproxDistinct(_column("approx_distinct", column))


def approx_quantiles(column: str, quantiles: Sequence[float] = (0.5, 0.9, 0.99)) -> Aggregate:
    """Quantiles of ``column``'s values (KLL, ranks within ~1.7%), reported as
    ``{"0.5": value, ...}``."""
    name = _column("approx_quantiles", column)
    if isinstance(quantiles, str | bytes) or not quantiles:
        raise QuantilesError(f"approx_quantiles({name!r}): quantiles must be a non-empty list")
    for q in quantiles:
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0 < q < 1:
            raise QuantilesError(
                f"approx_quantiles({name!r}): quantile {q!r} is not a number in (0, 1)"
            )
    qs = tuple(float(q) for q in quantiles)
    if len(set(qs)) != len(qs):
        twice = next(q for q in qs if qs.count(q) > 1)
        raise QuantilesError(f"approx_quantiles({name!r}): quantile {twice} is given twice")
    return ApproxQuantiles(name, qs)


def aggregate(kind: str, column: str | None = None, **options: Any) -> Aggregate:
    """An aggregate by its kind's name, as a declaration in data names it."""
    if kind == "count":
        if column is not None:
            raise AggregateColumnError(f"count() takes no column, got {column!r}")
        return count()
    factories: dict[str, Callable[..., Aggregate]] = {
        "sum": sum,
        "min": min,
        "max": max,
        "mean": mean,
        "approx_distinct": approx_distinct,
        "approx_quantiles": approx_quantiles,
    }
    if kind not in factories:
        raise UnknownAggregateError(
            f"unknown aggregate {kind!r}; kinds are {', '.join(sorted(KINDS))}"
        )
    return factories[kind](column, **options)
