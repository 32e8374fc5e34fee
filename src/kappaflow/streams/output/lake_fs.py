"""The lake's file operations through Hadoop's FileSystem API, driven over py4j.

Every path a lake table lives on (a local directory, ``file:``, ``hdfs:``, ``s3a:``) is
reached through the Hadoop file system Spark itself writes with, so the table works
wherever Spark's writer does, with the same configuration and credentials. This is the
one class that speaks to the JVM; the rest of the lake sees plain Python values.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from kappaflow.errors import LakePublishError, StoragePathError


@dataclass(frozen=True)
class Entry:
    """One child of a directory."""

    name: str
    is_dir: bool


@dataclass(frozen=True)
class FileStatus:
    """A file's size in bytes and modification time in milliseconds since the epoch."""

    size: int
    modified: int


class HadoopFs:
    """A table root's file system: paths are given relative to the root, as ``a/b/c``."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm: Any = spark._jvm
        self._jvm = jvm
        self._gateway: Any = spark.sparkContext._gateway
        self._conf: Any = spark._jsc.hadoopConfiguration()
        try:
            self._root: Any = jvm.org.apache.hadoop.fs.Path(root)
            self._fs: Any = self._root.getFileSystem(self._conf)
        except Py4JJavaError as error:
            cause = error.java_exception
            raise StoragePathError(
                f"cannot reach {root!r}: {cause.getClass().getSimpleName()}: "
                f"{cause.getMessage()} (use a path, a file: URI, or put the jars of the "
                "scheme's Hadoop file system in spark.jars)"
            ) from None
        #: The root as a fully qualified URI (``file:/tmp/t``, ``hdfs://nn/t``): what Spark's
        #: reader and writer are given.
        self.root_uri: str = self._fs.makeQualified(self._root).toString()

    def path(self, relative: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._root, relative) if relative else self._root

    def uri(self, relative: str) -> str:
        return f"{self.root_uri.rstrip('/')}/{relative}" if relative else self.root_uri

    def exists(self, relative: str) -> bool:
        return bool(self._fs.exists(self.path(relative)))

    def children(self, relative: str) -> list[Entry]:
        """The children of a directory, by name; none if it does not exist."""
        directory = self.path(relative)
        if not self._fs.exists(directory):
            return []
        entries = [
            Entry(str(status.getPath().getName()), bool(status.isDirectory()))
            for status in self._fs.listStatus(directory)
        ]
        return sorted(entries, key=lambda entry: entry.name)

    def status(self, relative: str) -> FileStatus:
        status = self._fs.getFileStatus(self.path(relative))
        return FileStatus(int(status.getLen()), int(status.getModificationTime()))

    def files_under(self, relative: str) -> list[str]:
        """Every file below a directory, as paths relative to that directory."""
        found: list[str] = []
        for entry in self.children(relative):
            child = f"{relative}/{entry.name}"
            if entry.is_dir:
                found.extend(f"{entry.name}/{name}" for name in self.files_under(child))
            else:
                found.append(entry.name)
        return found

    def rename(self, source: str, target: str) -> None:
        """Move a file; the target's directory is created first. Hadoop's rename reports a
        refusal by returning false rather than raising, which would otherwise go unseen."""
        destination = self.path(target)
        self._fs.mkdirs(destination.getParent())
        if not self._fs.rename(self.path(source), destination):
            raise LakePublishError(
                f"the file system refused to rename {self.uri(source)} to {self.uri(target)}"
            )

    def delete(self, relative: str) -> None:
        """Delete a file or a directory with its contents; a missing one is fine."""
        self._fs.delete(self.path(relative), True)

    def read_text(self, relative: str) -> str:
        stream = self._fs.open(self.path(relative))
        try:
            data = stream.readAllBytes()
        finally:
            stream.close()
        return bytes(data).decode()

    def write_atomically(self, relative: str, text: str) -> None:
        """Write a whole file that readers see complete or not at all, in place of any
        file of that name: a hidden temporary file in the same directory, then a rename
        (atomic on HDFS and local disks; on S3 the copy appears whole)."""
        directory, _, name = relative.rpartition("/")
        temporary = f"{directory}/.{name}.{uuid.uuid4().hex}.tmp".lstrip("/")
        stream = self._fs.create(self.path(temporary), False)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()
        # The directory exists (the temporary file is in it). A local disk's rename
        # replaces a file of that name; HDFS's refuses (false), and FileContext replaces.
        if not self._fs.rename(self.path(temporary), self.path(relative)):
            self._replace(temporary, relative)

    def _replace(self, source: str, target: str) -> None:
        """Rename onto an existing file. ``FileSystem.rename`` refuses that on HDFS (it
        returns false) where a local disk replaces the file; ``FileContext``'s rename with
        ``OVERWRITE`` replaces it on both, atomically."""
        fs = self._jvm.org.apache.hadoop.fs
        context = fs.FileContext.getFileContext(self._fs.getUri(), self._conf)
        options = self._gateway.new_array(fs.Options.Rename, 1)
        options[0] = fs.Options.Rename.OVERWRITE
        try:
            context.rename(self.path(source), self.path(target), options)
        except Py4JJavaError as error:
            cause = error.java_exception
            raise LakePublishError(
                f"the file system refused to replace {self.uri(target)}: "
                f"{cause.getClass().getSimpleName()}: {cause.getMessage()}"
            ) from None

    def parquet_rows(self, relative: str) -> int:
        """A Parquet file's row count, from its footer only."""
        hadoop = self._jvm.org.apache.parquet.hadoop
        source = hadoop.util.HadoopInputFile.fromPath(self.path(relative), self._conf)
        reader = hadoop.ParquetFileReader.open(source)
        try:
            return int(reader.getRecordCount())
        finally:
            reader.close()
