"""Setup's class-data archive: local drivers map Spark's classes from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kappaflow.errors import ClassArchiveError
from kappaflow.settings import Settings
from kappaflow.spark import cds

#: A driver that loads its classes with the JVM's class-loading log on, then exits.
DRIVER = """
import sys
from kappaflow.settings import Settings
from kappaflow.spark.session import build_session
spark = build_session(Settings.model_validate_json(sys.stdin.read()), "class-data-check")
spark.range(100).selectExpr("sum(id)").collect()
spark.stop()
"""


def with_jvm_options(settings: Settings, options: str) -> Settings:
    conf = {**settings.spark.conf}
    theirs = conf.get("spark.driver.extraJavaOptions")
    conf["spark.driver.extraJavaOptions"] = f"{theirs} {options}" if theirs else options
    return settings.model_copy(update={"spark": settings.spark.model_copy(update={"conf": conf})})


@pytest.mark.integration
def test_a_local_driver_maps_sparks_classes_from_setups_archive(
    offline: Settings, tmp_path: Path
) -> None:
    assert cds.archive_options(offline) is not None, "setup wrote no class-data archive"
    log = tmp_path / "classes.log"
    settings = with_jvm_options(offline, f"-Xlog:class+load=info:file={log}")
    done = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=settings.model_dump_json(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    sources = {
        line.split(" source: ")[0].split()[-1]: line.split(" source: ")[1]
        for line in log.read_text().splitlines()
        if " source: " in line
    }
    assert sources["org.apache.spark.SparkContext"] == "shared objects file (top)"
    shared = sum(source == "shared objects file (top)" for source in sources.values())
    assert shared > 5000, f"only {shared} of {len(sources)} classes came from the archive"


def test_the_archive_is_found_only_for_the_jars_it_was_written_with(
    offline: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = offline.model_copy(update={"jars_dir": tmp_path / "jars"})
    jar = tmp_path / "spark-core.jar"
    jar.write_bytes(b"one")
    monkeypatch.setattr(cds, "_spark_jars", lambda: [jar])
    first = cds.archive_path(settings)
    assert first is not None and first.parent == tmp_path / "jars" / "cds"
    assert cds.archive_options(settings) is None  # not written for these jars
    first.parent.mkdir(parents=True)
    first.write_bytes(b"")
    assert cds.archive_options(settings) == (
        f"-XX:SharedArchiveFile={first.resolve()} -Xlog:cds=off -Xlog:cds+dynamic=off"
    )
    jar.write_bytes(b"two, another build")
    assert cds.archive_path(settings) != first
    assert cds.archive_options(settings) is None


def test_a_cluster_masters_driver_uses_no_archive(offline: Settings) -> None:
    cluster = offline.model_copy(
        update={"spark": offline.spark.model_copy(update={"master": "spark://h:7077"})}
    )
    assert cds.archive_path(cluster) is None and cds.archive_options(cluster) is None


@pytest.mark.integration
def test_a_driver_that_cannot_write_the_archive_fails_setup_with_a_code(
    offline: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "cds" / "driver-test.jsa"
    monkeypatch.setattr(cds, "archive_path", lambda _settings: target)
    broken = with_jvm_options(offline, "-XX:+NoSuchOptionAnywhere")
    with pytest.raises(ClassArchiveError) as raised:
        cds.build_archive(broken)
    assert raised.value.code == "KF209"
    assert not target.exists() and list(target.parent.iterdir()) == []
