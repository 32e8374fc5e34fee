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


def last_committed(query_dir: Path) -> int | None:
    """The last batch the query finished (None: none yet)."""
    log = query_dir / "offsets"
    batches = sorted((int(p.name) for p in log.iterdir() if p.name.isdigit()), reverse=True)
    return next((b for b in batches if committed(query_dir, b)), None)


def move_source(query_dir: Path, topic: str, offsets: dict[int, int]) -> int | None:
    """Point a stopped query's next batch at ``offsets`` of ``topic`` (partition →
    offset): another cluster's offsets, after a failover. The query keeps its state and
    watermark; the batch after its last committed one reads ``topic`` from there.

    The last committed batch's end offsets are rewritten (Spark starts the next batch
    from them), and a batch planned after it but never committed is forgotten (Spark
    would otherwise run it again, with the old cluster's offsets). Returns the batch whose
    offsets were moved, or None if the query has committed none."""
    log = query_dir / "offsets"
    batches = sorted(int(p.name) for p in log.iterdir() if p.name.isdigit())
    last = last_committed(query_dir)
    if last is None:
        return None
    for planned in (b for b in batches if b > last):
        (log / str(planned)).unlink()
        (log / f".{planned}.crc").unlink(missing_ok=True)
    lines = (log / str(last)).read_text().splitlines()
    # Line 0 is the version, line 1 the batch's metadata (its watermark among them), then
    # one line per source.
    for index in range(2, len(lines)):
        held = json.loads(lines[index])
        if isinstance(held, dict) and topic in held:
            held[topic] = {str(p): o for p, o in sorted(offsets.items())}
            lines[index] = json.dumps(held, separators=(",", ":"))
    scratch = log / f".{last}.moving"
    scratch.write_text("\n".join(lines))
    scratch.replace(log / str(last))
    # Spark's checksum of the old content: absent, the file is read unchecked.
    (log / f".{last}.crc").unlink(missing_ok=True)
    return last
