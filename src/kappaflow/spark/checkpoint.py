"""What a streaming query's checkpoint says it has consumed from its Kafka sources.

Spark writes, before running batch N, the end offsets of every source for that batch
(``offsets/N``: a version line, a metadata line, then one JSON line per source), and the
Kafka source writes the offsets it first started from (``sources/<i>/0``). Between the two
lies exactly what the query has read through batch N: a measurement that owes nothing to
what the query's own code counted.
"""

from __future__ import annotations

import json
from pathlib import Path

#: {topic: {partition: offset}}
Offsets = dict[str, dict[str, int]]


def start_offsets(query_dir: Path, source: int = 0) -> Offsets:
    """The offsets the query's ``source``-th source started from."""
    text = (query_dir / "sources" / str(source) / "0").read_bytes().decode().lstrip("\0")
    return _json_line(text.splitlines(), 1)


def batch_end_offsets(query_dir: Path, batch_id: int, source: int = 0) -> Offsets:
    """The offsets up to which batch ``batch_id`` read its ``source``-th source."""
    lines = (query_dir / "offsets" / str(batch_id)).read_text().splitlines()
    return _json_line(lines, 2 + source)


def offsets_consumed(query_dir: Path, batch_id: int, source: int = 0) -> int:
    """How many offsets of its ``source``-th source the query consumed in batches 0 to
    ``batch_id``. A partition that appeared after the start counts from offset 0, where
    Spark starts reading a new partition."""
    start = start_offsets(query_dir, source)
    end = batch_end_offsets(query_dir, batch_id, source)
    return sum(
        offset - start.get(topic, {}).get(partition, 0)
        for topic, partitions in end.items()
        for partition, offset in partitions.items()
    )


def committed(query_dir: Path, batch_id: int) -> bool:
    """Whether the query has finished batch ``batch_id`` (its commit log holds it)."""
    return (query_dir / "commits" / str(batch_id)).exists()


def batch_watermark(offset_log_entry: str) -> int:
    """The watermark (epoch ms) a micro-batch ran with, from its entry in a checkpoint's
    offset log: a version line, then the batch's metadata as JSON (0 if it has none)."""
    lines = offset_log_entry.splitlines()
    metadata = json.loads(lines[1]) if len(lines) > 1 and lines[1].startswith("{") else {}
    return int(metadata.get("batchWatermarkMs", 0))


def _json_line(lines: list[str], index: int) -> Offsets:
    value: Offsets = json.loads(lines[index])
    return value
