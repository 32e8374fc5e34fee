"""The JVM classpaths kappaflow needs, resolved once into the state directory.

Separate sets, because the broker and Spark pin different Scala, Jackson and slf4j
versions and must never share a classpath: the Kafka broker's runtime classpath, the
four connector jars Spark needs on top of what PySpark ships, MirrorMaker 2's, and the
Kafka Connect worker's with Debezium's PostgreSQL connector as its plugin.
Another distribution can describe a set of its own (a :class:`JarSet` whose POM it
ships) and :func:`resolve` it the same way.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kappaflow.errors import JarsDirError, JarsNotResolvedError
from kappaflow.install.maven import copy_dependencies, find_or_fetch_maven
from kappaflow.settings import Settings

_STAMP = ".resolved"


@dataclass(frozen=True)
class JarSet:
    name: str
    pom_resource: str
    include_artifact_ids: tuple[str, ...] = ()
    #: The package whose ``poms/`` directory holds ``pom_resource``.
    package: str = "kappaflow.install"

    def directory(self, settings: Settings) -> Path:
        return settings.jars_path / self.name

    def pom_text(self) -> str:
        return resources.files(self.package).joinpath("poms", self.pom_resource).read_text()

    def fingerprint(self) -> str:
        return hashlib.sha256(self.pom_text().encode()).hexdigest()

    def is_resolved(self, settings: Settings) -> bool:
        stamp = self.directory(settings) / _STAMP
        return stamp.is_file() and stamp.read_text().strip() == self.fingerprint()

    def jars(self, settings: Settings) -> list[Path]:
        """The resolved jars; a clear error if setup has not run."""
        if not self.is_resolved(settings):
            raise JarsNotResolvedError(
                f"the {self.name} jars are not resolved in {self.directory(settings)}: "
                "run `make setup` (or `kappaflow setup`)"
            )
        return sorted(self.directory(settings).glob("*.jar"))


KAFKA_BROKER = JarSet("kafka", "kafka-broker.xml")
#: MirrorMaker 2, for replication to a backup cluster (kafka/mirror.py): a JVM of its own.
KAFKA_MIRROR = JarSet("mirror", "kafka-mirror.xml")
#: The Kafka Connect worker for change data capture (kafka/connect.py): a JVM of its own.
KAFKA_CONNECT = JarSet("connect", "kafka-connect.xml")
#: The folder the Connect worker's ``plugin.path`` names: one folder per plugin in it.
CONNECT_PLUGINS = "connect-plugins"
#: Debezium's PostgreSQL connector, a plugin of that worker (isolated by Connect).
DEBEZIUM_POSTGRES = JarSet(f"{CONNECT_PLUGINS}/debezium-postgres", "debezium-postgres.xml")
#: Delta Kernel, the lake's table format (streams/output/lake_delta.py): on Spark's classpath.
LAKE_DELTA = JarSet("lake", "lake-delta.xml")
SPARK_CONNECTOR = JarSet(
    "spark",
    "spark-kafka.xml",
    (
        "spark-sql-kafka-0-10_2.13",
        "spark-token-provider-kafka-0-10_2.13",
        "kafka-clients",
        "commons-pool2",
        "jedis",
        "postgresql",
        "spark-avro_2.13",
        "protobuf-java",
    ),
)


def kafka_broker_jars(settings: Settings) -> list[Path]:
    return KAFKA_BROKER.jars(settings)


def spark_connector_jars(settings: Settings) -> list[Path]:
    return SPARK_CONNECTOR.jars(settings)


def lake_delta_jars(settings: Settings) -> list[Path]:
    return LAKE_DELTA.jars(settings)


def kafka_mirror_jars(settings: Settings) -> list[Path]:
    return KAFKA_MIRROR.jars(settings)


def kafka_connect_jars(settings: Settings) -> list[Path]:
    return KAFKA_CONNECT.jars(settings)


def connect_plugin_path(settings: Settings) -> Path:
    """The Connect worker's plugin path, once Debezium's connector is resolved in it."""
    DEBEZIUM_POSTGRES.jars(settings)
    return (settings.jars_path / CONNECT_PLUGINS).resolve()


def resolve_all(settings: Settings) -> list[str]:
    """Resolve every jar set setup provides that is missing or whose POM changed; return
    what was done."""
    return resolve(
        settings,
        (
            KAFKA_BROKER,
            SPARK_CONNECTOR,
            KAFKA_MIRROR,
            KAFKA_CONNECT,
            DEBEZIUM_POSTGRES,
            LAKE_DELTA,
        ),
    )


def resolve(settings: Settings, jar_sets: tuple[JarSet, ...]) -> list[str]:
    """Resolve those of ``jar_sets`` that are missing or whose POM changed."""
    done: list[str] = []
    pending = [s for s in jar_sets if not s.is_resolved(settings)]
    if not pending:
        return done
    root = settings.jars_path.resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise JarsDirError(f"cannot create {root}: {exc.strerror}") from None
    mvn = find_or_fetch_maven(settings.state_dir.resolve() / "tools")
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        poms = Path(scratch)
        settings_xml = poms / "maven-settings.xml"
        settings_xml.write_text(
            resources.files("kappaflow.install").joinpath("poms", "maven-settings.xml").read_text()
        )
        for jar_set in pending:
            pom = poms / jar_set.pom_resource
            pom.write_text(jar_set.pom_text())
            staging = poms / f"{jar_set.name.replace('/', '-')}-jars"
            copy_dependencies(
                mvn,
                pom=pom,
                settings_xml=settings_xml,
                local_repo=root / "m2",
                output_dir=staging,
                include_artifact_ids=jar_set.include_artifact_ids,
            )
            (staging / _STAMP).write_text(jar_set.fingerprint() + "\n")
            target = jar_set.directory(settings)
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(staging), target)
            done.append(f"{jar_set.name}: {len(list(target.glob('*.jar')))} jars in {target}")
    return done
