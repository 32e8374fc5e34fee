"""A job and fix functions for the dead-letter replay tests (tests/test_dlq.py)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import kappaflow as kf

#: The file a crashing fix counts its calls in, and the call it kills its process at.
CALLS_FILE = "KF_TEST_FIX_CALLS"
KILL_AT = "KF_TEST_FIX_KILL_AT"


@dataclass
class Order:
    order_id: str
    buyer: str
    country: str
    amount: float
    at: kf.EventTime


def orders_per_country(job: kf.Job) -> None:
    """Orders and their total per country and hour: the whole source into a window."""
    orders = job.source(job.param("topic"), Order, key="buyer", watermark="1h")
    per_country = orders.window(tumbling="1h").aggregate(
        "per_country", by="country", orders=kf.count(), total=kf.sum("amount")
    )
    per_country.to(kf.topic())


def passed_on(job: kf.Job) -> None:
    """Every order as it is: a plain stream of the whole source."""
    job.source(job.param("topic"), Order, key="buyer").to(kf.topic(), name="passed")


def crashes(value: bytes | None, reason: str) -> bytes | None:
    """The value as it is, but the process is SIGKILLed at call number ``KILL_AT``."""
    calls = Path(os.environ[CALLS_FILE])
    n = int(calls.read_text() or "0") + 1 if calls.exists() else 1
    calls.write_text(str(n))
    if n == int(os.environ[KILL_AT]):
        os.kill(os.getpid(), signal.SIGKILL)
    from fix_orders import fix

    return fix(value, reason)


def returns_text(value: bytes | None, reason: str) -> str:
    return "not bytes"
