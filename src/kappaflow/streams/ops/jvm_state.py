"""The engine's Java window operators' state values, read back in Python.

io.kappaflow.engine.Windows keeps, per (window_start, shard), a map state ``keys`` from
each key (its JSON array) to its accumulators' bytes, and a value state ``final``;
io.kappaflow.engine.Sessions keeps, per shard, one value state ``sessions`` of bytes. Both
write with Java's DataOutputStream (big-endian), and the Java sources define the layouts
(Aggregates.Accumulators.bytes, Sessions.Processor.save), which this module follows:

- a key's accumulators: the marker ``FORMAT`` (long), its version (long), how many
  aggregates it holds (int), then per aggregate its name and kind (``writeUTF``), whether
  integral (boolean), the watermark it started at (long; -1: the window's start), a
  count (long), a long, a double, whether it holds a value (boolean), and a sketch's
  length (int) and bytes (HLL or KLL; none for other aggregates). Accumulators written
  before the marker have no marker, names, kinds, flags nor starts: the version, then
  per declared aggregate, in declaration order, the fields from the count on;
- a shard's sessions: their number (int), then per session its key (``writeUTF``: a
  two-byte length and modified UTF-8), start, end and version (longs), whether final
  (boolean), and its accumulators' length (int) and bytes; then the ids counted (int),
  each an id hash and its event time (longs).

For the state readers (counting/state.py), through Spark's state data source.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

#: The Java operators' state variables.
WINDOW_KEYS = "keys"
WINDOW_FINAL = "final"
SESSIONS = "sessions"


#: The first long of a key's accumulators that name their aggregates
#: (Aggregates.FORMAT); older ones start with their version, never negative.
FORMAT = -0x4B46_0002


class Accumulator(NamedTuple):
    """One aggregate's accumulator (Aggregates.Accumulators, at one index): what each
    field holds depends on the aggregate (count: ``counted``; an integral sum, min or
    max: ``long``, another ``double``; a mean: ``double`` and ``counted``; approx_distinct
    and approx_quantiles: ``sketch``)."""

    counted: int
    long: int
    double: float
    present: bool
    sketch: bytes
    #: Its aggregate's name (None in accumulators written before they had names).
    name: str | None = None
    #: The watermark it started counting at, -1 for the window's start.
    since: int = -1


class Accumulators(NamedTuple):
    """A key's accumulators, in the order of the aggregates they were written for, and
    the version of its values."""

    version: int
    values: tuple[Accumulator, ...]
    #: Their bytes as the state holds them (for Aggregates.valuesJson).
    raw: bytes


class HeldSession(NamedTuple):
    """A session Sessions holds."""

    key: str
    start: int
    end: int
    version: int
    final: bool
    accumulators: Accumulators


class _Reader:
    """Big-endian fields from bytes, as Java's DataInputStream reads them."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError(f"state value ends at byte {len(self.data)}: {n} more wanted")
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def long(self) -> int:
        value: int = struct.unpack(">q", self.take(8))[0]
        return value

    def int(self) -> int:
        value: int = struct.unpack(">i", self.take(4))[0]
        return value

    def double(self) -> float:
        value: float = struct.unpack(">d", self.take(8))[0]
        return value

    def bool(self) -> bool:
        return self.take(1) != b"\x00"

    def utf(self) -> str:
        (n,) = struct.unpack(">H", self.take(2))
        return modified_utf8(self.take(n))

    def done(self) -> None:
        if self.at != len(self.data):
            raise ValueError(f"state value has {len(self.data) - self.at} bytes left over")


def modified_utf8(data: bytes) -> str:
    """Text as Java's ``writeUTF`` encodes it: UTF-8, but NUL as two bytes (C0 80) and a
    character beyond the BMP as its two UTF-16 surrogates, three bytes each."""
    # C0 is no UTF-8 byte, so C0 80 is always a NUL.
    text = data.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
    # Surrogate pairs, decoded one by one, back into the characters they encode.
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")


def _accumulators(reader: _Reader, aggregates: int) -> Accumulators:
    begins = reader.at
    first = reader.long()
    named = first == FORMAT
    version = reader.long() if named else first
    values = []
    for _ in range(reader.int() if named else aggregates):
        name, since = None, -1
        if named:
            name, _kind, _integral, since = reader.utf(), reader.utf(), reader.bool(), reader.long()
        counted, long, double = reader.long(), reader.long(), reader.double()
        present = reader.bool()
        sketch = reader.take(reader.int())
        values.append(Accumulator(counted, long, double, present, sketch, name, since))
    return Accumulators(version, tuple(values), reader.data[begins : reader.at])


def accumulators_version(data: bytes) -> int:
    """The version of a key's values in its accumulators' bytes."""
    reader = _Reader(bytes(data))
    first = reader.long()
    return reader.long() if first == FORMAT else first


def read_accumulators(data: bytes, aggregates: int) -> Accumulators:
    """A key's accumulators: a value of Windows' ``keys`` map state (``aggregates``: how
    many the operator was declared with, for accumulators that do not say)."""
    reader = _Reader(bytes(data))
    found = _accumulators(reader, aggregates)
    reader.done()
    return found


def read_sessions(data: bytes, aggregates: int) -> tuple[list[HeldSession], list[tuple[int, int]]]:
    """A shard's sessions, and the ids counted (id hash, event time): a value of Sessions'
    ``sessions`` value state."""
    reader = _Reader(bytes(data))
    sessions = []
    for _ in range(reader.int()):
        key = reader.utf()
        start, end, version = reader.long(), reader.long(), reader.long()
        final = reader.bool()
        held = _Reader(reader.take(reader.int()))
        accumulators = _accumulators(held, aggregates)
        held.done()
        sessions.append(HeldSession(key, start, end, version, final, accumulators))
    ids = [(reader.long(), reader.long()) for _ in range(reader.int())]
    reader.done()
    return sessions, ids
