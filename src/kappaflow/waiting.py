"""Waiting for a condition with a deadline: how kappaflow waits for services, jobs and
data, never with a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from kappaflow.errors import WaitTimeoutError

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.2,
    what: str,
) -> T:
    """Call ``check`` until it returns something other than ``None``; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise WaitTimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
