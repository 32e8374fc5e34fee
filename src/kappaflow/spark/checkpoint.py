"""What a streaming query's checkpoint says it has consumed from its Kafka sources.

Spark writes, before running batch N, the end offsets of every source for that batch
(``offsets/N``: a version line, a metadata line, then one JSON line per source), and the
Kafka source writes the offsets it first started from (``sources/<i>/0``). Between the two
lies exactly what the query has read through batch N: a measurement that owes nothing to
what the query's own code counted.

A move of a stopped query's offsets (``move_source``: a ``--from-time`` rewind, a
failover) rewrites the end offsets of its last batch, so the difference alone would no
longer say what the query read. Each move is recorded beside the checkpoint
(``kappaflow-moves.json``), with the offsets it took away; what the query consumed counts
what it read before the move, then what it reads from where it was moved to: records read
again count each time they are read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

#: {topic: {partition: offset}}
Offsets = dict[str, dict[str, int]]

#: Beside a query's checkpoint: the moves of its offsets (move_source).
MOVES = "kappaflow-moves.json"


class CheckpointFiles(Protocol):
    """A query's checkpoint folder on any file system, paths relative to it: a local
    folder (``LocalFiles``), or one on HDFS or S3 through Hadoop's API, which only a
    Spark driver reaches (streams/output/lake_fs.py ``HadoopFs``)."""

    def read_text(self, relative: str) -> str: ...

    def exists(self, relative: str) -> bool: ...


class LocalFiles:
    """A query's checkpoint folder on the local disk."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def read_text(self, relative: str) -> str:
        return (self.folder / relative).read_text()

    def exists(self, relative: str) -> bool:
        return (self.folder / relative).exists()


def is_remote(location: str) -> bool:
    """Whether a checkpoint location is a URI of a file system other than the local disk
    (``hdfs://``, ``s3a://``), which only Hadoop's API in a Spark driver reaches."""
    return "://" in location and not location.startswith("file:")


def _files(query_dir: Path | CheckpointFiles) -> CheckpointFiles:
    return LocalFiles(query_dir) if isinstance(query_dir, Path) else query_dir


def start_offsets(query_dir: Path | CheckpointFiles, source: int = 0) -> Offsets:
    """The offsets the query's ``source``-th source started from."""
    text = _files(query_dir).read_text(f"sources/{source}/0").lstrip("\0")
    return _json_line(text.splitlines(), 1)


def batch_end_offsets(query_dir: Path, batch_id: int, source: int = 0) -> Offsets:
    """The offsets up to which batch ``batch_id`` read its ``source``-th source."""
    lines = (query_dir / "offsets" / str(batch_id)).read_text().splitlines()
    return _json_line(lines, 2 + source)


def offsets_consumed(query_dir: Path | CheckpointFiles, batch_id: int) -> int:
    """How many offsets of its Kafka sources (every one: a stream-stream join has two) the
    query consumed in batches 0 to ``batch_id``, counting what a move made it read again
    each time it was read. A partition that appeared after the start counts from offset 0,
    where Spark starts reading a new partition."""
    files = _files(query_dir)
    lines = files.read_text(f"offsets/{batch_id}").splitlines()
    shifted = sum(m["offsets"] for m in _moves(files) if m["batch"] <= batch_id)
    return _consumed(files, lines) + shifted


def _consumed(query_dir: Path | CheckpointFiles, lines: list[str]) -> int:
    """Offsets between each Kafka source's start and the end offsets of an offset log
    entry's ``lines``.

    From the third line on, the entry holds one line per place a source takes in the
    query's plan (``-`` for one with no offsets yet, other JSON for a source that is not
    Kafka's): a source read in two places (a stream and its dead letters) has two equal
    lines and one ``sources/<i>/0``, numbered in the order the sources first appear."""
    total = 0
    distinct = list(dict.fromkeys(lines[2:]))
    for source, line in enumerate(distinct):
        end = _kafka_offsets(line)
        if end is None:
            continue
        start = start_offsets(query_dir, source)
        if not set(start) <= set(end):
            raise ValueError(f"{query_dir}: source {source} started on {sorted(start)}")
        total += sum(
            offset - start.get(topic, {}).get(partition, 0)
            for topic, partitions in end.items()
            for partition, offset in partitions.items()
        )
    return total


def _kafka_offsets(line: str) -> Offsets | None:
    if not line.startswith("{"):
        return None
    held = json.loads(line)
    if not all(isinstance(p, dict) for p in held.values()):
        return None
    return {str(t): {str(p): int(o) for p, o in ps.items()} for t, ps in held.items()}


def _moves(query_dir: Path | CheckpointFiles) -> list[dict[str, int]]:
    """The moves of the query's offsets: the batch whose end offsets each rewrote, and the
    offsets it took away from what the batches up to it had consumed."""
    files = _files(query_dir)
    if not files.exists(MOVES):
        return []
    found: list[dict[str, int]] = json.loads(files.read_text(MOVES))
    return found


def committed(query_dir: Path, batch_id: int) -> bool:
    """Whether the query has finished batch ``batch_id`` (its commit log holds it)."""
    return (query_dir / "commits" / str(batch_id)).exists()


def batch_watermark(offset_log_entry: str) -> int:
    """The watermark (epoch ms) a micro-batch ran with, from its entry in a checkpoint's
    offset log: a version line, then the batch's metadata as JSON (0 if it has none)."""
    lines = offset_log_entry.splitlines()
    metadata = json.loads(lines[1]) if len(lines) > 1 and lines[1].startswith("{") else {}
    return int(metadata.get("batchWatermarkMs", 0))


def shuffle_partitions(query_dir: Path) -> int | None:
    """The shuffle partitions (its state's partitions) a query's last planned batch ran
    with, as its offset log entry pins them: a restart takes them from there, whatever
    the session says (None: no batch yet)."""
    log = query_dir / "offsets"
    batches = [int(p.name) for p in log.iterdir() if p.name.isdigit()] if log.is_dir() else []
    if not batches:
        return None
    lines = (log / str(max(batches))).read_text().splitlines()
    metadata = json.loads(lines[1]) if len(lines) > 1 and lines[1].startswith("{") else {}
    value = (metadata.get("conf") or {}).get("spark.sql.shuffle.partitions")
    return None if value is None else int(value)


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
    would otherwise run it again, with the old cluster's offsets). The move is recorded
    (``MOVES``), so that ``offsets_consumed`` still counts what the query read before it.
    Returns the batch whose offsets were moved, or None if the query has committed none."""
    log = query_dir / "offsets"
    batches = sorted(int(p.name) for p in log.iterdir() if p.name.isdigit())
    last = last_committed(query_dir)
    if last is None:
        return None
    for planned in (b for b in batches if b > last):
        (log / str(planned)).unlink()
        (log / f".{planned}.crc").unlink(missing_ok=True)
    lines = (log / str(last)).read_text().splitlines()
    before = _consumed(query_dir, lines)
    # Line 0 is the version, line 1 the batch's metadata (its watermark among them), then
    # one line per source.
    for index in range(2, len(lines)):
        held = _kafka_offsets(lines[index])
        if held is not None and topic in held:
            held[topic] = {str(p): o for p, o in sorted(offsets.items())}
            lines[index] = json.dumps(held, separators=(",", ":"))
    moves = [*_moves(query_dir), {"batch": last, "offsets": before - _consumed(query_dir, lines)}]
    recorded = query_dir / f".{MOVES}.moving"
    recorded.write_text(json.dumps(moves))
    recorded.replace(query_dir / MOVES)
    scratch = log / f".{last}.moving"
    scratch.write_text("\n".join(lines))
    scratch.replace(log / str(last))
    # Spark's checksum of the old content: absent, the file is read unchecked.
    (log / f".{last}.crc").unlink(missing_ok=True)
    return last
