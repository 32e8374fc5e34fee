"""The one place a SparkSession is built.

Everything comes from the settings: the master (local or a cluster), the Kafka connector
jars, the checkpoint root, the RocksDB state store with changelog checkpointing, UTC as
the session time zone (event time is always UTC here), and any extra ``spark.*`` options.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from kappaflow.install.artifacts import lake_delta_jars, spark_connector_jars
from kappaflow.install.engine import engine_jar
from kappaflow.install.jdk import find_java
from kappaflow.install.localfs import FILE_SYSTEM_CONF, local_fs_jar
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.spark.cds import archive_options
from kappaflow.spark.environment import LOOPBACK, is_local_master, spark_environment

_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
logger.kafka.name = org.apache.kafka
logger.kafka.level = error
# transformWithState logs a warning for every read of a state variable that is not set
# yet, which is how every new window starts.
logger.tws.name = org.apache.spark.sql.execution.python.streaming
logger.tws.level = error
# Delta Kernel warns on every read of a table without a checkpoint yet (a young table).
logger.deltakernel.name = io.delta.kernel
logger.deltakernel.level = error
"""


#: Spark options of a driver that runs a real-time query. Real-time mode's pipelined
#: shuffle holds a network buffer until it fills (32 KiB) or until this wait is over
#: (Spark's default: 50 ms); at tens of thousands of events a second a buffer takes
#: longer than that to fill, so every record would wait up to 50 ms on its way to the
#: aggregation, which is most of a real-time query's latency budget.
REAL_TIME_CONF = {"spark.shuffle.streaming.networkBufferMaxWaitTimeMs": "5"}
#: How long a real-time batch runs before Spark checkpoints its offsets and state. Each
#: new batch restarts the long-running tasks, which stalls output for seconds, so batches
#: are long; a restarted job re-reads at most this much (at least once).
CHECKPOINT_INTERVAL = "5 minutes"


def real_time_spark(settings: Settings, slots: int) -> SettingsOverrides:
    """The ``spark`` settings of a driver whose real-time query holds ``slots`` tasks.

    Real-time mode holds a slot per task for as long as it runs, and fails when they
    are not all free at once; a local master gets exactly those slots (threads). A
    cluster master is kept: it needs the free slots. The user's own Spark options win
    over REAL_TIME_CONF."""
    master = settings.spark.master
    if re.fullmatch(r"local\[(\*|\d+)\]", master) is not None:
        master = f"local[{slots}]"
    return SettingsOverrides(
        spark_master=master, spark_conf={**REAL_TIME_CONF, **settings.spark.conf}
    )


def session_conf(settings: Settings, app_name: str) -> dict[str, str]:
    """Every Spark option kappaflow sets, derived from ``settings``."""
    spark = settings.spark
    # The engine's operators and writers (streams/jvm) run in every session.
    # Delta Kernel (the lake's table format) too: its classes are in the engine's jar's API.
    connector = (*spark_connector_jars(settings), *lake_delta_jars(settings))
    jars = [str(jar.resolve()) for jar in (*connector, engine_jar(settings))]
    ours = f"-Dlog4j2.configurationFile=file:{_log4j_file(settings)}"
    # Classes mapped from setup's archive (cds.py) where there is one.
    archive = archive_options(settings)
    if archive is not None:
        ours = f"{ours} {archive}"
    conf = {
        "spark.master": spark.master,
        "spark.app.name": app_name,
        "spark.jars": ",".join(jars),
        "spark.driver.memory": spark.driver_memory,
        "spark.driver.extraJavaOptions": ours,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(spark.shuffle_partitions),
        "spark.ui.enabled": str(spark.ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.checkpointLocation": str(settings.checkpoint_root.resolve()),
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        # Changelog checkpointing uploads only the changed keys each batch instead of
        # RocksDB snapshots: much cheaper commits for large state.
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Checkpoint format v2 is what stateful real-time mode requires in 4.3.
        "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
        # No byte limit on the Arrow batches sent to Python workers (the row limit stays):
        # with a limit, Spark measures the batch's size after every row, which costs more
        # than the rows themselves once a batch has list columns.
        "spark.sql.execution.arrow.maxBytesPerBatch": "2147483647",
        # Generated code is kept per distinct plan; a job of several queries plans more
        # than the default 100 entries hold, and every miss compiles (and the JVM then
        # JIT-compiles) the class again each micro-batch.
        "spark.sql.codegen.cache.maxEntries": "2000",
        # The output writer caches each batch's rows (writer.py), and Spark serializes a
        # cached partition's column batches (10,000 rows each) with Java serialization,
        # whose stream keeps every object it wrote until it is reset: by default every
        # 100 objects, so a task held up to 1,000,000 rows' bytes whatever the memory
        # manager allowed, and a 2,000,000-record batch ran a 512 MiB local driver out of
        # heap. Reset after each: a batch's class descriptor is written again, a few
        # bytes for megabytes of columns.
        "spark.serializer.objectStreamReset": "1",
        "spark.local.dir": str((settings.state_dir / "spark-tmp").resolve()),
        # Python workers run this interpreter (with kappaflow's dependencies), not whatever
        # `python3` is first on PATH. On a cluster, point it at the executors' Python
        # through spark.conf.
        "spark.pyspark.python": sys.executable,
    }
    if is_local_master(spark.master):
        # A local master needs no network: the driver listens on loopback only.
        conf["spark.driver.bindAddress"] = LOOPBACK
        conf["spark.driver.host"] = LOOPBACK
    local_fs = local_fs_jar(settings) if is_local_master(spark.master) else None
    if local_fs is not None:
        # Checkpoint files without a chmod and a readlink process each (install/localfs.py).
        conf.update(FILE_SYSTEM_CONF)
    conf.update(spark.conf)
    # The user's jars (a job's own, such as the IoT scorer's) come after the connector's.
    if spark.conf.get("spark.jars"):
        conf["spark.jars"] = ",".join([*jars, spark.conf["spark.jars"]])
    # The user's JVM options come after ours (a later -D or -XX wins), and keep the log
    # configuration.
    theirs = spark.conf.get("spark.driver.extraJavaOptions")
    if theirs:
        conf["spark.driver.extraJavaOptions"] = f"{ours} {theirs}"
    if local_fs is not None:
        # After the user's options, so that a class path of theirs keeps ours too.
        class_path = [conf.get("spark.driver.extraClassPath"), str(local_fs.resolve())]
        conf["spark.driver.extraClassPath"] = os.pathsep.join(p for p in class_path if p)
    return conf


def build_session(settings: Settings, app_name: str = "kappaflow") -> SparkSession:
    """A SparkSession for ``settings``; Java and the connector jars are checked first."""
    find_java()
    settings.checkpoint_root.mkdir(parents=True, exist_ok=True)
    os.environ.update(spark_environment(settings, os.environ))
    builder = SparkSession.builder
    for key, value in session_conf(settings, app_name).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _log4j_file(settings: Settings) -> Path:
    path = (settings.state_dir / "spark-log4j2.properties").resolve()
    if not path.exists() or path.read_text() != _LOG4J2:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_LOG4J2)
    return path
