"""The engine's jar, compiled at setup from the Java sources under ``streams/jvm/java``.

Unlike the other jars kappaflow builds, this one is not optional: the job API's
operators run in it. A machine without ``javac`` gets a clear error at setup and when a
session starts, never a job that runs without its engine.
"""

from __future__ import annotations

from pathlib import Path

from kappaflow.errors import JarBuildError
from kappaflow.install.artifacts import lake_delta_jars, spark_connector_jars
from kappaflow.install.javabuild import JDK_HOW, JavaBuild, pyspark_jars
from kappaflow.install.jdk import ensure_javac
from kappaflow.settings import Settings

#: The clients the tasks' writers compile against (KafkaOutput.java: Kafka's;
#: RedisOutput.java: Redis's; PostgresOutput.java: PostgreSQL's JDBC driver;
#: Protobuf.java: protobuf-java): PySpark does not ship them; the connector's jars, which
#: setup resolves, hold them.
_CONNECTOR_JARS = ("kafka-clients-", "jedis-", "postgresql-", "protobuf-java-")


def _classpath(settings: Settings) -> list[Path]:
    connector = [
        jar for jar in spark_connector_jars(settings) if jar.name.startswith(_CONNECTOR_JARS)
    ]
    # DeltaLake.java commits the lake's batches with Delta Kernel.
    return [*_pyspark_classpath(), *connector, *lake_delta_jars(settings)]


def _pyspark_classpath() -> list[Path]:
    return pyspark_jars(
        "scala-library-*.jar",
        "scala-reflect-*.jar",
        "spark-core_*.jar",
        "spark-common-utils-java_*.jar",
        "spark-common-utils_*.jar",
        "spark-catalyst_*.jar",
        "spark-sql-api_*.jar",
        "spark-sql_*.jar",
        "spark-unsafe_*.jar",
        "datasketches-java-*.jar",
        "datasketches-memory-*.jar",
        "jackson-core-*.jar",
        "jackson-databind-*.jar",
        "jackson-annotations-*.jar",
        "slf4j-api-*.jar",
        "hadoop-client-api-*.jar",
    )


ENGINE = JavaBuild(
    jar_name="kappaflow-engine.jar",
    folder="engine",
    package=("io", "kappaflow", "engine"),
    classpath=_classpath,
    without="the job API has no engine",
    home="kappaflow.streams.jvm",
)


def build_engine(settings: Settings) -> str | None:
    """Compile the engine's jar if it is missing or stale (installing the JDK first where
    setup can); return what was done."""
    if ENGINE.jar(settings) is not None:
        return None
    installed = ensure_javac()
    built = ENGINE.build(settings)
    if ENGINE.jar(settings) is None:
        raise JarBuildError(built or f"kappaflow-engine.jar was not built; {JDK_HOW}")
    return "; ".join(line for line in (installed, built) if line) or None


def engine_jar(settings: Settings) -> Path:
    """The engine's jar, built first if it is missing or its sources changed."""
    jar = ENGINE.jar(settings)
    if jar is None:
        build_engine(settings)
        jar = ENGINE.jar(settings)
    assert jar is not None
    return jar
