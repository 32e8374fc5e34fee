"""The column-at-a-time JSON text of a job's outputs, against ``json``."""

import json

import pyarrow as pa

from kappaflow.streams.output.json_columns import iso_literals, string_literals
from kappaflow.timeutil import from_epoch_ms, iso

AWKWARD = ["plain", 'with "quotes"', "back\\slash", "new\nline", "tab\there", "\x01", "été", ""]


def test_string_literals_are_json_dumps() -> None:
    literals = string_literals(pa.array(AWKWARD)).to_pylist()
    assert literals == [json.dumps(s, ensure_ascii=False) for s in AWKWARD]
    assert [json.loads(text) for text in literals] == AWKWARD


def test_iso_literals_are_timeutil_iso() -> None:
    millis = [0, 1_795_297_473_806, 1_795_297_473_806, 1_795_297_440_000, 86_399_999]
    assert iso_literals(pa.array(millis, pa.int64())).to_pylist() == [
        f'"{iso(from_epoch_ms(m))}"' for m in millis
    ]
