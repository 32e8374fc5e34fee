"""A fix for the revenue job's dead letters (examples/revenue.py): ``kappaflow dlq replay
revenue --fix fix_orders:fix`` from this folder.

A fix gets each dead letter's original bytes and the reason the job gave, and returns the
bytes to send back through the job, or None to pass the dead letter over (it stays in
``revenue.dlq``, and the next replay does not offer it again). Bytes the job still
cannot take go to ``revenue.dlq`` again, with the new reason.

Two mistakes of an old order client are mended here: an amount written as text with a
decimal comma (``"12,50"``), and a time without a zone (``"2026-11-23 10:00:04"``, which
that client wrote in UTC). Anything that is not a JSON object is passed over.
"""

from __future__ import annotations

import json
import re

_DECIMAL_COMMA = re.compile(r"^-?\d+(,\d+)?$")
_NO_ZONE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?$")


def fix(value: bytes | None, reason: str) -> bytes | None:
    try:
        order = json.loads(value or b"")
    except ValueError:
        return None
    if not isinstance(order, dict):
        return None
    amount = order.get("amount")
    if isinstance(amount, str) and _DECIMAL_COMMA.match(amount):
        order["amount"] = float(amount.replace(",", "."))
    # Any other amount is sent as it is: the job dead-letters it again, with its reason.
    at = order.get("at")
    if isinstance(at, str) and _NO_ZONE.match(at):
        order["at"] = at.replace(" ", "T") + "Z"
    return json.dumps(order).encode()
