"""What a counting job counts: its definition, validated once, carried as job parameters."""

from __future__ import annotations

import keyword
from dataclasses import asdict, dataclass
from datetime import timedelta

from kappaflow.errors import ConflictingOptionsError, InvalidFieldError, InvalidWindowError
from kappaflow.timeutil import parse_duration

#: The part of a ``--realtime`` job that runs the real-time query in a driver process of
#: its own (pipelines.base.Part, counting/pipeline.py).
REALTIME_PART = "realtime"


@dataclass(frozen=True)
class CountSpec:
    """A counting job's definition. Durations are milliseconds."""

    source: str
    key_field: str
    time_field: str
    id_field: str | None = None
    window_ms: int | None = None
    slide_ms: int | None = None
    session_gap_ms: int | None = None
    watermark_ms: int = 10_000
    allowed_lateness_ms: int = 0
    realtime: bool = False
    available_now: bool = False
    #: Where a job without a checkpoint reads its source from: Spark's
    #: ``startingOffsets`` (``earliest``, or per-partition offsets as JSON: --from-time).
    start: str = "earliest"

    def __post_init__(self) -> None:
        for label, value in (
            ("--key", self.key_field),
            ("--time", self.time_field),
            ("--id", self.id_field),
        ):
            if value is not None and not _is_field_name(value):
                raise InvalidFieldError(
                    f"{label} {value!r} is not a field name: use letters, digits and '_' "
                    "(not a Python keyword)"
                )
        if (self.window_ms is None) == (self.session_gap_ms is None):
            raise ConflictingOptionsError("give exactly one of --window and --session-gap")
        if self.session_gap_ms is not None and self.session_gap_ms <= 0:
            raise InvalidWindowError("--session-gap must be positive")
        if self.session_gap_ms is not None and self.realtime:
            raise ConflictingOptionsError("--realtime counts fixed windows: use --window with it")
        if self.window_ms is not None and self.window_ms <= 0:
            raise InvalidWindowError("--window must be positive")
        if self.slide_ms is not None:
            if self.window_ms is None:
                raise ConflictingOptionsError("--slide goes with --window")
            if not 0 < self.slide_ms <= self.window_ms or self.window_ms % self.slide_ms:
                raise InvalidWindowError("--slide must divide --window and be no larger than it")
        if self.watermark_ms < 0 or self.allowed_lateness_ms < 0:
            raise InvalidWindowError("--watermark and --allowed-lateness must not be negative")
        if self.realtime and self.available_now:
            raise ConflictingOptionsError("--realtime and --available-now exclude each other")

    @property
    def size_ms(self) -> int:
        assert self.window_ms is not None
        return self.window_ms

    @property
    def step_ms(self) -> int:
        return self.slide_ms or self.size_ms

    def to_params(self) -> dict[str, str]:
        return {key: str(value) for key, value in asdict(self).items() if value is not None}

    @classmethod
    def from_params(cls, params: dict[str, str]) -> CountSpec:
        ints = {"window_ms", "slide_ms", "session_gap_ms", "watermark_ms", "allowed_lateness_ms"}
        bools = {"realtime", "available_now"}
        values: dict[str, object] = {}
        for key, value in params.items():
            if key in ints:
                values[key] = int(value)
            elif key in bools:
                values[key] = value == "True"
            else:
                values[key] = value
        return cls(**values)  # type: ignore[arg-type]


def _is_field_name(text: str) -> bool:
    """A top-level field a counting job's record type can have (counting/job.py)."""
    return text.isidentifier() and not keyword.iskeyword(text)


def duration_ms(text: str | None) -> int | None:
    """A CLI duration (``10s``) in milliseconds."""
    if text is None:
        return None
    return int(parse_duration(text) / timedelta(milliseconds=1))
