"""Setting kappaflow up on a machine: prerequisites and JVM artifacts from Maven Central."""

from kappaflow.install.artifacts import JarSet, kafka_broker_jars, resolve_all, spark_connector_jars
from kappaflow.install.jdk import JavaInfo, find_java

__all__ = [
    "JarSet",
    "JavaInfo",
    "find_java",
    "kafka_broker_jars",
    "resolve_all",
    "spark_connector_jars",
]
