"""The IoT application's scorer on the JVM, built at setup from ``java/io/kappaflow/iot``.

``io.kappaflow.iot.SeriesScorer`` scores a series' readings with a model's published
parameters as ``kappaflow.iot.models.Scorer`` does, for the ``forecast`` and ``robust``
families, with the same memory (JSON). It runs inside Spark's JVM, where a stateful
processor can run in real-time mode (Python ones cannot). The real-time scorer's driver
puts the jar on its ``spark.jars`` (so executors of a cluster get it too).
"""

from __future__ import annotations

from kappaflow.install.javabuild import JavaBuild, pyspark_jars

SCORER = JavaBuild(
    jar_name="kappaflow-iot.jar",
    folder="iot",
    package=("io", "kappaflow", "iot"),
    classpath=lambda _settings: pyspark_jars(
        "jackson-core-*.jar",
        "jackson-databind-*.jar",
        "jackson-annotations-*.jar",
        "commons-math3-*.jar",
        "scala-library-*.jar",
        "spark-core_*.jar",
        "spark-common-utils-java_*.jar",
        "spark-catalyst_*.jar",
        "spark-sql-api_*.jar",
        "spark-sql_*.jar",
    ),
    without="the IoT application's scorer on the JVM is not available",
    home="kappaflow.iot.jvm",
)
scorer_jar = SCORER.jar
build_scorer = SCORER.build
