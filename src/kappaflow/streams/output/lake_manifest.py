"""A lake table's manifests: one JSON file per committed batch, the table's only truth.

A batch is committed when its manifest exists, and only the files a manifest lists are
part of the table; anything else under the root (a crashed attempt's files, staging) is
invisible to the readers. The layout of a table root::

    <root>/_kappaflow/manifest/<batch id, 20 digits>.json   the commit points
    <root>/_kappaflow/publishing/<batch id, 20 digits>.json the files a publish is moving
    <root>/_staging/batch=<id>-<attempt>/...                Spark's output, before publishing
    <root>/date=2026-11-23/region=eu/b<id>-<attempt>-part-....parquet   committed data
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kappaflow.errors import LakeManifestError, LakeSchemaError

MANIFEST_DIR = "_kappaflow/manifest"
PUBLISHING_DIR = "_kappaflow/publishing"
STAGING_DIR = "_staging"
FORMAT = 1


def record_name(batch_id: int) -> str:
    """The file name of a batch's manifest and publishing record; zero-padded so that name
    order is batch order (a batch id is a Java long: at most 19 digits)."""
    return f"{batch_id:020d}.json"


def is_record(name: str) -> bool:
    """Whether a file in a manifest directory is a manifest: not a temporary file being
    written (hidden), nor a Hadoop checksum file."""
    return name.endswith(".json") and not name.startswith(".")


@dataclass(frozen=True)
class DataFile:
    path: str  # relative to the root, with the partition directories
    rows: int


@dataclass(frozen=True)
class Manifest:
    batch_id: int
    rows: int
    files: tuple[DataFile, ...]
    #: Spark's schema as JSON (``StructType.jsonValue()``): the data columns, then the
    #: partition columns, the order every reader returns them in.
    schema: dict[str, Any]
    partition_by: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "batch_id": self.batch_id,
                "rows": self.rows,
                "files": [{"path": f.path, "rows": f.rows} for f in self.files],
                "partition_by": list(self.partition_by),
                "schema": self.schema,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        try:
            data = json.loads(text)
            return cls(
                batch_id=int(data["batch_id"]),
                rows=int(data["rows"]),
                files=tuple(DataFile(str(f["path"]), int(f["rows"])) for f in data["files"]),
                schema=dict(data["schema"]),
                partition_by=tuple(str(column) for column in data["partition_by"]),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise LakeManifestError(
                f"manifest {where} is not a kappaflow lake manifest: {error!r}"
            ) from None

    def column_types(self) -> dict[str, str]:
        """Each column's Spark type as JSON text, by name."""
        return column_types(self.schema)


def column_types(schema: dict[str, Any]) -> dict[str, str]:
    """Each column's Spark type by name: its name (``string``) or, for a nested type, its
    JSON."""
    return {
        str(field["name"]): (
            field["type"] if isinstance(field["type"], str) else json.dumps(field["type"])
        )
        for field in schema["fields"]
    }


def check_schema(table: Manifest, schema: dict[str, Any], root: str) -> None:
    """Refuse a batch whose columns are not the table's, by name and type.

    Added columns are refused too, even nullable ones: the readers take the table's
    schema from its latest manifest, and files written before a column existed would need
    every reader to fill it with nulls the same way. Nullability may differ (Parquet stores
    every Spark column as optional)."""
    expected = table.column_types()
    given = column_types(schema)
    for name, kind in expected.items():
        if name not in given:
            raise LakeSchemaError(f"lake table {root}: the batch has no column {name!r}")
        if given[name] != kind:
            raise LakeSchemaError(
                f"lake table {root}: column {name!r} is {given[name]} in the batch, "
                f"{kind} in the table"
            )
    added = sorted(set(given) - set(expected))
    if added:
        raise LakeSchemaError(
            f"lake table {root}: the batch adds column(s) {', '.join(map(repr, added))}; "
            "a table's columns are fixed by its first batch"
        )
