"""A faster ``file:`` file system for Spark's checkpoints on this machine, built at setup.

Without Hadoop's native library (it is not on Maven Central or PyPI), Hadoop's local file
system starts a ``chmod`` process for every file and directory it creates, and a
``readlink`` process for every link lookup, which FileContext makes on each rename.
Structured Streaming writes several checkpoint files per micro-batch (offset log, commit
log, state store files per partition): a stateful query on two partitions starts over a
hundred processes per batch, which dominates a small batch's fixed cost. The Java
sources under ``java/`` subclass Hadoop's classes and do both through java.nio; setup
compiles them with the JDK's ``javac`` against the Hadoop API that PySpark ships
(``javabuild.py``).

Only local masters use the jar (``spark/session.py``): on a cluster, checkpoints live on
a distributed store. Without ``javac`` (a JRE only), setup says so and Spark keeps
Hadoop's default, which is correct, only slower.
"""

from __future__ import annotations

from kappaflow.install.javabuild import JavaBuild, pyspark_jars

JAR_NAME = "kappaflow-localfs.jar"

#: The Spark options that put the jar's classes in charge of ``file:`` paths.
FILE_SYSTEM_CONF = {
    "spark.hadoop.fs.file.impl": "io.kappaflow.hadoop.NioLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "io.kappaflow.hadoop.NioLocalFs",
}

LOCAL_FS = JavaBuild(
    jar_name=JAR_NAME,
    folder="localfs",
    package=("io", "kappaflow", "hadoop"),
    classpath=lambda _settings: pyspark_jars("hadoop-client-api-*.jar"),
    without=(
        "Spark's checkpoints use Hadoop's default local file system, which starts a process "
        "per checkpoint file (slower batches)"
    ),
)
local_fs_jar = LOCAL_FS.jar
build_local_fs = LOCAL_FS.build
