"""A class-data archive for local Spark drivers, built at setup.

A Spark driver loads some 18,000 classes before its first micro-batch, and the JVM
parses and verifies each one again at every start: on two busy cores that is most of the
ten to twenty seconds a job takes to start. The JVM can map the classes a run loaded
from an archive instead (application class-data sharing, ``-XX:ArchiveClassesAtExit``
then ``-XX:SharedArchiveFile``). Setup runs a short stateful query with a Python
``transformWithState`` in a driver that writes the archive when it exits, and every
driver on a local master maps it from then on.

The JVM uses an archive only with the class path and jar files it was written with (it
checks each jar's size and time), so the archive's name holds a fingerprint of them and
of the JVM; after an upgrade of PySpark or Java the old archive is simply not found, and
drivers start as before until setup writes a new one. Cluster masters are left alone:
their drivers' class paths differ.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kappaflow.errors import ClassArchiveError
from kappaflow.install.jdk import jdk_tool
from kappaflow.install.localfs import local_fs_jar
from kappaflow.settings import Settings
from kappaflow.spark.environment import is_local_master

_DIRECTORY = "cds"
#: How long setup lets the archive's driver run its query and write the archive.
BUILD_TIMEOUT_S = 600.0
#: The JVM says nothing about the archive: a stale or missing one only means a slower start.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _spark_jars() -> list[Path]:
    import pyspark

    return sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))


def _fingerprint(settings: Settings) -> str | None:
    """What the archive depends on: the JVM and every jar on the driver's class path, by
    name, size and time. None without a ``java``."""
    java = jdk_tool("java")
    if java is None:
        return None
    home = java.resolve().parent.parent
    digest = hashlib.sha256(str(home).encode())
    local_fs = local_fs_jar(settings)
    files = [home / "lib" / "server" / "libjvm.so", *_spark_jars()]
    if local_fs is not None:
        files.append(local_fs.resolve())
    for path in files:
        try:
            stat = path.stat()
        except OSError:
            continue
        digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def archive_path(settings: Settings) -> Path | None:
    """Where the archive for ``settings``'s drivers is (or would be) kept; None where
    drivers do not use one (a cluster master, no ``java``)."""
    if not is_local_master(settings.spark.master):
        return None
    fingerprint = _fingerprint(settings)
    if fingerprint is None:
        return None
    return settings.jars_path / _DIRECTORY / f"driver-{fingerprint}.jsa"


def archive_options(settings: Settings) -> str | None:
    """The driver JVM's options that map the archive, when setup has written it."""
    path = archive_path(settings)
    if path is None or not path.is_file():
        return None
    return f"-XX:SharedArchiveFile={path.resolve()} {_QUIET}"


def build_archive(settings: Settings) -> str | None:
    """Write the archive if it is missing; return what was done, or why not (None: it
    was there already)."""
    path = archive_path(settings)
    if path is None:
        return None
    if path.is_file():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        staged = Path(scratch) / path.name
        dumping = f"-XX:ArchiveClassesAtExit={staged} {_QUIET}"
        conf = dict(settings.spark.conf)
        theirs = conf.get("spark.driver.extraJavaOptions")
        conf["spark.driver.extraJavaOptions"] = f"{theirs} {dumping}" if theirs else dumping
        training = settings.model_copy(
            update={
                "state_dir": Path(scratch) / "state",
                "jars_dir": settings.jars_path,
                "spark": settings.spark.model_copy(update={"conf": conf}),
            }
        )
        try:
            result = subprocess.run(
                [sys.executable, "-m", "kappaflow.spark.cds_training"],
                input=training.model_dump_json(),
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
                check=False,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        except subprocess.TimeoutExpired:
            raise ClassArchiveError(
                f"the driver writing the class-data archive ran over {BUILD_TIMEOUT_S:.0f} s"
            ) from None
        if result.returncode != 0:
            tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise ClassArchiveError(f"the driver writing the class-data archive failed: {tail}")
        if not staged.is_file():
            return (
                "this JVM wrote no class-data archive, so Spark drivers start without one "
                "(slower): a JDK of the system's packages (Debian/Ubuntu: "
                "openjdk-17-jdk-headless) writes one"
            )
        for old in path.parent.glob("driver-*.jsa"):
            old.unlink()
        staged.replace(path)
    size = path.stat().st_size / 2**20
    return f"class-data archive for Spark drivers written ({size:.0f} MiB) at {path}"
