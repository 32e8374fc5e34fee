"""Maven, for resolving JVM artifacts: the machine's own, or one fetched from Maven Central.

A user who has Python and Java but no Maven still gets a working setup: Apache Maven's
binary distribution is itself an artifact on Maven Central, checked against its SHA-512.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from kappaflow.errors import MavenError

CENTRAL = "https://repo.maven.apache.org/maven2"
MAVEN_VERSION = "3.9.9"


def find_or_fetch_maven(tools_dir: Path) -> Path:
    """``mvn`` from PATH, else a Maven unpacked under ``tools_dir`` (fetched once)."""
    on_path = shutil.which("mvn")
    if on_path is not None:
        return Path(on_path)
    home = tools_dir / f"apache-maven-{MAVEN_VERSION}"
    mvn = home / "bin" / "mvn"
    if mvn.exists():
        return mvn
    base = f"{CENTRAL}/org/apache/maven/apache-maven/{MAVEN_VERSION}"
    name = f"apache-maven-{MAVEN_VERSION}-bin.tar.gz"
    tools_dir.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=tools_dir) as scratch:
            archive = Path(scratch) / name
            urllib.request.urlretrieve(f"{base}/{name}", archive)
            with urllib.request.urlopen(f"{base}/{name}.sha512", timeout=60) as response:
                expected = response.read().decode().split()[0]
            actual = hashlib.sha512(archive.read_bytes()).hexdigest()
            if actual != expected:
                raise MavenError(f"Maven download is corrupt (sha512 {actual[:12]}…)")
            with tarfile.open(archive) as tar:
                tar.extractall(scratch, filter="data")
            shutil.move(str(Path(scratch) / f"apache-maven-{MAVEN_VERSION}"), home)
    except OSError as exc:
        raise MavenError(
            f"Maven is not installed and fetching it from Maven Central failed ({exc}); "
            "install it (Debian/Ubuntu: sudo apt-get install maven) and run make setup again"
        ) from None
    return mvn


def copy_dependencies(
    mvn: Path,
    *,
    pom: Path,
    settings_xml: Path,
    local_repo: Path,
    output_dir: Path,
    include_artifact_ids: tuple[str, ...] = (),
) -> None:
    """Resolve ``pom``'s runtime classpath and copy its jars into ``output_dir``."""
    argv = [
        str(mvn),
        "-q",
        "-B",
        "-s",
        str(settings_xml),
        "-f",
        str(pom),
        f"-Dmaven.repo.local={local_repo}",
        "dependency:copy-dependencies",
        # Most Kafka modules are runtime scope in the published POMs; "runtime"
        # means compile + runtime here.
        "-DincludeScope=runtime",
        f"-DoutputDirectory={output_dir}",
    ]
    if include_artifact_ids:
        argv.append(f"-DincludeArtifactIds={','.join(include_artifact_ids)}")
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        output = [ln.strip() for ln in (result.stdout + result.stderr).splitlines() if ln.strip()]
        errors = [ln.replace("[ERROR] ", "") for ln in output if ln.startswith("[ERROR]")]
        reason = errors[0] if errors else (output[-1] if output else f"exit {result.returncode}")
        raise MavenError(f"resolving {pom.name} from Maven Central failed: {reason}")
