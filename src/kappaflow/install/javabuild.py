"""Jars kappaflow compiles at setup from the Java sources it ships (a ``java/`` folder
beside the package that uses them).

Each is built with the JDK's ``javac`` against jars PySpark ships, into
``<jars_dir>/<folder>/``, and built again when its sources or those jars change (a stamp
holds their fingerprint). Without ``javac`` (a JRE only) a build says what is lost and
how to get it; the product runs without the jar.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from kappaflow.errors import JarBuildError
from kappaflow.install.jdk import jdk_tool
from kappaflow.settings import Settings

_STAMP = ".built"
JDK_HOW = (
    "install a JDK (Debian/Ubuntu: apt-get install openjdk-17-jdk-headless) and run `make setup`"
)


def pyspark_jars(*patterns: str) -> list[Path]:
    """The jars of PySpark's distribution matching each glob ``pattern`` (the newest of
    each); a pattern that matches none is an error."""
    import pyspark

    folder = Path(pyspark.__file__).parent / "jars"
    found = []
    for pattern in patterns:
        matches = sorted(folder.glob(pattern))
        if not matches:
            raise JarBuildError(f"PySpark's jar {pattern} is missing: reinstall pyspark")
        found.append(matches[-1])
    return found


@dataclass(frozen=True)
class JavaBuild:
    """One jar: its name, the folder of its sources under ``java/`` (a Java package),
    the jars it compiles against, and what a machine without ``javac`` goes without."""

    jar_name: str
    folder: str
    package: tuple[str, ...]
    #: The jars to compile against, for these settings (jars setup resolved live under
    #: the settings' state directory).
    classpath: Callable[[Settings], Sequence[Path]]
    without: str
    #: The package whose ``java/`` folder holds the sources.
    home: str = "kappaflow.install"

    def _sources(self) -> list[Traversable]:
        where = resources.files(self.home).joinpath("java", *self.package)
        return sorted(
            (entry for entry in where.iterdir() if entry.name.endswith(".java")),
            key=lambda entry: entry.name,
        )

    def _fingerprint(self, classpath: Sequence[Path]) -> str:
        digest = hashlib.sha256()
        for jar in classpath:
            digest.update(jar.name.encode())
        for source in self._sources():
            digest.update(source.name.encode())
            digest.update(source.read_bytes())
        return digest.hexdigest()

    def directory(self, settings: Settings) -> Path:
        return settings.jars_path / self.folder

    def jar(self, settings: Settings) -> Path | None:
        """The built jar, or None when setup could not build it (or its sources changed)."""
        folder = self.directory(settings)
        stamp, jar = folder / _STAMP, folder / self.jar_name
        if not (jar.is_file() and stamp.is_file()):
            return None
        if stamp.read_text().strip() != self._fingerprint(self.classpath(settings)):
            return None
        return jar

    def build(self, settings: Settings) -> str | None:
        """Compile the jar if it is missing or stale; return what was done, or why not."""
        if self.jar(settings) is not None:
            return None
        javac = jdk_tool("javac")
        if javac is None:
            return f"javac not found, so {self.without}. To build {self.jar_name}, {JDK_HOW}"
        classpath = self.classpath(settings)
        folder = self.directory(settings)
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            work = Path(scratch)
            source_dir = work / "src"
            source_dir.mkdir()
            files = []
            for source in self._sources():
                path = source_dir / source.name
                path.write_bytes(source.read_bytes())
                files.append(str(path))
            classes = work / "classes"
            cp = ":".join(str(jar) for jar in classpath)
            result = subprocess.run(
                [str(javac), "--release", "17", "-nowarn", "-cp", cp, "-d", str(classes), *files],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise JarBuildError(
                    f"javac failed building {self.jar_name}: {result.stderr.strip()}"
                )
            staged = work / self.jar_name
            with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as jar:
                for path in sorted(classes.rglob("*.class")):
                    jar.write(path, path.relative_to(classes).as_posix())
            staged.replace(folder / self.jar_name)
        (folder / _STAMP).write_text(self._fingerprint(classpath) + "\n")
        return f"{self.folder}: {self.jar_name} built with {javac}"
