"""JSON text for a batch's changes, a column at a time (Arrow compute).

A batch of the counting job changes up to hundreds of thousands of windows, and each
change becomes a changelog record and a Redis value. Built one Python dict and one
``json.dumps`` at a time, that text cost the driver more than a second per 100,000
changes while Spark's executors sat idle waiting for the batch to end; built here as
whole columns, it costs milliseconds.
"""

from __future__ import annotations

import json
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from kappaflow.timeutil import from_epoch_ms, iso

Column: TypeAlias = pa.Array | pa.ChunkedArray

#: Characters a JSON string literal cannot hold as they are.
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


def join(*parts: Column | str) -> Column:
    """Row by row, the concatenation of ``parts`` (columns and literal strings)."""
    return pc.binary_join_element_wise(*parts, "")


def json_object(fields: dict[str, Column | str]) -> Column:
    """Row by row, a JSON object of ``fields``: each value is JSON text already (a
    column of it, or one literal for every row)."""
    parts: list[Column | str] = []
    for name, value in fields.items():
        parts += [", " if parts else "{", json.dumps(name), ": ", value]
    return join(*parts, "}")


def json_items(values: list[Column | str]) -> Column:
    """Row by row, ``values`` (JSON text) separated by commas: a row's items of a JSON
    array, to be joined with other rows' into one."""
    parts: list[Column | str] = []
    for value in values:
        parts += [",", value] if parts else [value]
    return join(*parts)


def number_text(values: Column) -> Column:
    return pc.cast(values, pa.string())


def string_literals(values: Column) -> Column:
    """Each string as a JSON string literal (``json.dumps(s, ensure_ascii=False)``).

    Strings that need escaping are rare (keys are page names, user ids...); those few go
    through ``json.dumps``, the rest are only quoted.
    """
    quoted = join('"', values, '"')
    needs_escape = pc.match_substring_regex(values, _NEEDS_ESCAPE)
    if not pc.any(needs_escape).as_py():
        return quoted
    if isinstance(quoted, pa.ChunkedArray):  # replace_with_mask takes arrays only
        quoted, needs_escape = quoted.combine_chunks(), needs_escape.combine_chunks()
    escaped = [
        json.dumps(value, ensure_ascii=False) for value in values.filter(needs_escape).to_pylist()
    ]
    return pc.replace_with_mask(quoted, needs_escape, pa.array(escaped, pa.string()))


def iso_literals(millis: Column) -> Column:
    """Epoch milliseconds as quoted ISO-8601 UTC times, ``timeutil.iso``'s format.

    A batch holds few distinct window bounds, so each is formatted once.
    """
    distinct = pc.unique(millis)
    texts = pa.array(
        [f'"{iso(from_epoch_ms(value))}"' for value in distinct.to_pylist()], pa.string()
    )
    return pc.take(texts, pc.index_in(millis, distinct))


def booleans(values: Column) -> Column:
    return pc.if_else(values, "true", "false")


def quoted(values: Column) -> Column:
    """Strings that need no escaping (numbers, ``booleans``) as JSON string literals."""
    return join('"', values, '"')
