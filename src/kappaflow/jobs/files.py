"""A job's files: the names in its directory, atomic writes, and where a location lies on
this machine."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

#: The job's plan as its driver declared it (``streams.runtime.describe``); a part's
#: driver writes ``plan.PART.json`` beside it.
PLAN = "plan.json"


#: Present while a start from a savepoint restores the job (jobs/savepoints.py): names
#: the savepoint; the job then starts from a savepoint only.
RESTORING = "restoring.json"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a scratch file, then rename it over ``path``: a reader (status,
    `jobs`, the demo) sees the old file or the new one, never half of one."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text(text)
    scratch.replace(path)


def local_path(location: str) -> Path | None:
    """The path a location (a checkpoint's, a lake table's) names on this machine (a
    path, or a ``file:`` URI as Hadoop reads it: the path as written, not
    percent-decoded); None on another file system."""
    parts = urlsplit(location)
    if not parts.scheme:
        return Path(location)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return Path(parts.path)
    return None
