"""A faster ``file:`` file system for Spark's checkpoints on this machine, built at setup.

Without Hadoop's native library (it is not on Maven Central or PyPI), Hadoop's local file
system starts a ``chmod`` process for every file and directory it creates, and a
``readlink`` process for every link lookup, which FileContext makes on each rename.
Structured Streaming writes several checkpoint files per micro-batch (offset log, commit
log, state store files per partition): a stateful query on two partitions starts over a
hundred processes per batch, which dominates a small batch's fixed cost. The Java
sources under ``java/`` subclass Hadoop's classes and do both through java.nio; setup
compiles them with the JDK's ``javac`` against the Hadoop API that PySpark ships.

Only local masters use the jar (``spark/session.py``): on a cluster, checkpoints live on
a distributed store. Without ``javac`` (a JRE only), setup says so and Spark keeps
Hadoop's default, which is correct, only slower.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
import zipfile
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from kappaflow.errors import LocalFsBuildError
from kappaflow.install.java import jdk_tool
from kappaflow.settings import Settings

JAR_NAME = "kappaflow-localfs.jar"
_STAMP = ".built"
_PACKAGE = ("io", "kappaflow", "hadoop")

#: The Spark options that put the jar's classes in charge of ``file:`` paths.
FILE_SYSTEM_CONF = {
    "spark.hadoop.fs.file.impl": "io.kappaflow.hadoop.NioLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "io.kappaflow.hadoop.NioLocalFs",
}


def _sources() -> list[Traversable]:
    folder = resources.files("kappaflow.install").joinpath("java", *_PACKAGE)
    return sorted(
        (entry for entry in folder.iterdir() if entry.name.endswith(".java")),
        key=lambda entry: entry.name,
    )


def _hadoop_api_jar() -> Path:
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    if not jars:
        raise LocalFsBuildError("PySpark's hadoop-client-api jar is missing: reinstall pyspark")
    return jars[-1]


def _fingerprint(hadoop_jar: Path) -> str:
    digest = hashlib.sha256(hadoop_jar.name.encode())
    for source in _sources():
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def _directory(settings: Settings) -> Path:
    return settings.jars_path / "localfs"


def local_fs_jar(settings: Settings) -> Path | None:
    """The built jar, or None when setup could not build it (or its sources changed)."""
    folder = _directory(settings)
    stamp = folder / _STAMP
    jar = folder / JAR_NAME
    if not (jar.is_file() and stamp.is_file()):
        return None
    if stamp.read_text().strip() != _fingerprint(_hadoop_api_jar()):
        return None
    return jar


def build_local_fs(settings: Settings) -> str | None:
    """Compile the jar if it is missing or stale; return what was done, or why not."""
    if local_fs_jar(settings) is not None:
        return None
    javac = jdk_tool("javac")
    if javac is None:
        return (
            "javac not found, so Spark's checkpoints use Hadoop's default local file system, "
            "which starts a process per checkpoint file (slower batches). To build the faster "
            "one, install a JDK (Debian/Ubuntu: apt-get install openjdk-17-jdk-headless) and "
            "run `make setup` again"
        )
    hadoop_jar = _hadoop_api_jar()
    folder = _directory(settings)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        work = Path(scratch)
        source_dir = work / "src"
        source_dir.mkdir()
        files = []
        for source in _sources():
            path = source_dir / source.name
            path.write_bytes(source.read_bytes())
            files.append(str(path))
        classes = work / "classes"
        command = [str(javac), "--release", "17", "-nowarn", "-cp", str(hadoop_jar)]
        result = subprocess.run(
            [*command, "-d", str(classes), *files],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise LocalFsBuildError(f"javac failed building {JAR_NAME}: {result.stderr.strip()}")
        staged = work / JAR_NAME
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as jar:
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
        staged.replace(folder / JAR_NAME)
    (folder / _STAMP).write_text(_fingerprint(hadoop_jar) + "\n")
    return f"localfs: {JAR_NAME} built with {javac}"
