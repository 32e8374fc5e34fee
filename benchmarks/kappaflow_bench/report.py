"""What every benchmark reports the same way: percentiles, the machine, result files."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_N = TypeVar("_N", int, float)


def percentile(values: Sequence[_N], q: float) -> _N | None:
    """The nearest-rank percentile, ``q`` in [0, 100]: the smallest value with at least
    ``q`` % of the values at or below it, always one of the values (p100 is the maximum);
    None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def machine() -> dict[str, Any]:
    """The machine a run measured, and how busy it was when the run began: other work
    on it shows in the load average, and the figures are only as quiet as that."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg(),
    }
    # Linux only; a description is nice to have, never worth failing a run for.
    with contextlib.suppress(OSError, IndexError, ValueError):
        text = Path("/proc/cpuinfo").read_text()
        info["cpu_model"] = next(
            (line.split(":", 1)[1].strip() for line in text.splitlines() if "model name" in line),
            None,
        )
        mem = Path("/proc/meminfo").read_text().split()
        info["memory_gib"] = round(int(mem[1]) / 1024 / 1024, 1)
    return info


def write_json(path: Path, result: DataclassInstance | dict[str, Any]) -> Path:
    """``result`` (a dataclass or a dict) as indented JSON at ``path``, its directory made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = result if isinstance(result, dict) else asdict(result)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
