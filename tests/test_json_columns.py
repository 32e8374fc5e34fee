"""The column-at-a-time JSON text of the counting job's outputs, against ``json``."""

import json

import pyarrow as pa

from kappaflow.counting.json_columns import iso_literals, string_literals
from kappaflow.counting.rows import CORRECTION, FINAL, PROVISIONAL
from kappaflow.counting.sink import changelog_records, leaves_final
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


def test_changelog_records_parse_back_to_the_changes() -> None:
    start = 1_795_297_440_000
    changes = pa.table(
        {
            "key": ["a", 'say "hi"', "é"],
            "window_start": [start, start, start - 60_000],
            "window_end": [start + 60_000, start + 60_000, start],
            "count": [3, 1, 7],
            "previous": [2, 0, 6],
            "kind": [PROVISIONAL, PROVISIONAL, CORRECTION],
            "version": [4, 1, 9],
            "watermark": [0, 0, start + 5_000],
        }
    )
    keys, values = changelog_records(changes, 12)
    assert [json.loads(k) for k in keys] == [
        ["a", start],
        ['say "hi"', start],
        ["é", start - 60_000],
    ]
    first, _, last = (json.loads(v) for v in values)
    assert first == {
        "key": "a",
        "window_start": iso(from_epoch_ms(start)),
        "window_end": iso(from_epoch_ms(start + 60_000)),
        "count": 3,
        "previous": 2,
        "kind": PROVISIONAL,
        "version": 4,
        "watermark": None,
        "mode": "micro-batch",
        "batch": 12,
    }
    assert last["key"] == "é"
    assert last["watermark"] == iso(from_epoch_ms(start + 5_000))
    assert last["kind"] == CORRECTION


def test_a_window_is_final_once_the_watermark_passes_its_end() -> None:
    changes = pa.table(
        {
            "kind": [PROVISIONAL, FINAL, CORRECTION, CORRECTION],
            "window_end": [100, 100, 100, 100],
            "watermark": [50, 100, 150, 90],
        }
    )
    assert leaves_final(changes).to_pylist() == [False, True, True, False]
