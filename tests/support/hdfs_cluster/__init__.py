"""A real HDFS for tests: Hadoop's MiniDFSCluster (one NameNode, one DataNode) in a JVM of
its own, its jars resolved from Maven Central into the state directory like kappaflow's
own (poms/hdfs-minicluster.xml)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

from kappaflow.install.artifacts import JarSet, resolve
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

HDFS_JARS = JarSet(
    "hdfs-minicluster",
    "hdfs-minicluster.xml",
    ("hadoop-client-minicluster", "junit-jupiter-api", "opentest4j"),
    package="hdfs_cluster",
)
_MAIN = "org.apache.hadoop.mapreduce.MiniHadoopClusterManager"
_DEFAULT_FS = re.compile(r"<name>fs\.defaultFS</name>\s*<value>([^<]+)</value>")


def _pyspark_jars() -> Path:
    return Path(pyspark.__file__).parent / "jars"


@contextmanager
def mini_hdfs(settings: Settings, work_dir: Path) -> Iterator[str]:
    """A running HDFS; its URI (``hdfs://127.0.0.1:PORT``). Its data lives in ``work_dir``."""
    resolve(settings, (HDFS_JARS,))
    ours = HDFS_JARS.jars(settings)
    client = sorted(_pyspark_jars().glob("hadoop-client-api-*.jar"))
    wanted = next(j.name for j in ours if j.name.startswith("hadoop-client-minicluster-"))
    version = wanted.removeprefix("hadoop-client-minicluster-").removesuffix(".jar")
    assert client and client[0].name == f"hadoop-client-api-{version}.jar", (
        f"PySpark's Hadoop client is {client}; poms/hdfs-minicluster.xml pins {version}"
    )
    classpath = ":".join([*(str(j.resolve()) for j in ours), str(_pyspark_jars() / "*")])
    conf = work_dir / "hdfs-site.xml"
    log = (work_dir / "hdfs.log").open("w")
    process = subprocess.Popen(
        [
            "java",
            "-Xmx512m",
            f"-Dtest.build.data={work_dir / 'data'}",
            "-cp",
            classpath,
            _MAIN,
            "-nomr",
            "-format",
            "-nnport",
            "0",
            "-writeConfig",
            str(conf),
        ],
        cwd=work_dir,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def started() -> str | None:
        if process.poll() is not None:
            raise RuntimeError(f"HDFS exited with {process.returncode}: see {log.name}")
        found = _DEFAULT_FS.search(conf.read_text()) if conf.is_file() else None
        return found.group(1).rstrip("/") if found else None

    try:
        yield wait_for(started, timeout=120, interval=0.5, what="the mini HDFS to start")
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        log.close()
