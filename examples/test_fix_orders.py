"""The revenue job's fix (examples/fix_orders.py) on the dead letters it is meant for."""

from __future__ import annotations

import json

from fix_orders import fix


def test_mends_a_decimal_comma_and_a_time_without_a_zone() -> None:
    sent = b'{"order_id": "o1", "amount": "12,50", "at": "2026-11-23 10:00:04"}'
    fixed = fix(sent, "field 'amount' is not a number")
    assert fixed is not None
    assert json.loads(fixed) == {"order_id": "o1", "amount": 12.5, "at": "2026-11-23T10:00:04Z"}


def test_passes_over_what_is_not_an_order_and_keeps_what_it_cannot_mend() -> None:
    assert fix(b"{not json", "not valid JSON") is None
    assert fix(b"[1, 2]", "not a JSON object") is None
    assert fix(None, "empty record") is None
    kept = fix(b'{"amount": "lots"}', "field 'amount' is not a number")
    assert kept is not None and json.loads(kept) == {"amount": "lots"}
