"""One Nexmark run: generate, run each query on kappaflow and on Flink, compare, measure.

The generator writes ``--events`` events of a seeded run to three topics (person,
auction, bid). Every query then reads the same topics from their start, on each engine
in turn, alone on the machine (but for what others run on it):

- kappaflow: the query's job on the job API (queries.py), started as ``kappaflow jobs
  start`` starts one; its time is Spark's: the output query's micro-batches from the
  first to the one after which its status accounts for every event of the topics it
  reads, each batch's ``triggerExecution`` summed (they run back to back); then it is
  stopped and removed. The driver's start (JVM, session) is not in it, as the Flink
  JVM's is not in Flink's.
- Flink: the query in Flink SQL (flink_app.py), bounded by the topics' ends; its time is
  the job's net runtime as Flink reports it (submission to the end of input, the JVM
  and the mini-cluster already up).

Throughput per core is events / (cores * seconds), events being the records of the
topics the query reads and cores the machine's (both engines run on all of them: Spark
``local[*]``, Flink parallelism 2). Each engine's results go to a topic of their own
and are compared after the run (compare.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kappaflow.errors import CommandLineError, JobError, KappaflowError, TopicNotFoundError
from kappaflow.jobs.manager import ACTIVE_STATES, JobManager, JobState
from kappaflow.jobs.removal import remove_job
from kappaflow.jobs.status import job_status
from kappaflow.kafka.topics import create_topic, delete_topic
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.waiting import wait_for
from kappaflow_bench.nexmark.compare import compare, read_rows
from kappaflow_bench.nexmark.generator import KINDS, produce
from kappaflow_bench.report import machine, write_json
from kappaflow_bench.ysb.engines import (
    FLINK_PARALLELISM,
    FLINK_VERSION,
    AppEngine,
    FlinkEngine,
    flink_connector_jars,
)

#: Every query the benchmark knows (nexmark/nexmark's numbering).
QUERIES = ("q0", "q1", "q2", "q3", "q5", "q7", "q8")
#: How long one query may take on one engine.
QUERY_TIMEOUT_S = 1800.0


@dataclass
class QueryRun:
    query: str
    events: int
    #: Per engine: seconds, events/s, events/(core·s), result rows; or why it did not run.
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: kappaflow's throughput over Flink's, when both ran.
    ratio: float | None = None
    agreement: dict[str, Any] = field(default_factory=dict)


@dataclass
class NexmarkResult:
    events: int
    seed: int
    cores: int
    partitions: int
    produced: dict[str, Any] = field(default_factory=dict)
    queries: list[QueryRun] = field(default_factory=list)
    #: Geometric mean of the ratios of the queries both engines ran.
    geomean_ratio: float | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)


def parse_queries(text: str) -> list[str]:
    names = [q.strip() for q in text.split(",") if q.strip()]
    unknown = [q for q in names if q not in QUERIES]
    if unknown or not names:
        raise CommandLineError(f"--queries: unknown {unknown} (known: {', '.join(QUERIES)})")
    return names


def run(
    settings: Settings,
    *,
    events: int,
    queries: list[str],
    seed: int,
    partitions: int,
    engines: tuple[str, ...],
    out_dir: Path,
    overrides: SettingsOverrides,
    say: Callable[[str], None],
) -> NexmarkResult:
    import pyspark

    from kappaflow_bench.nexmark.queries import MISSING, READS
    from kappaflow_bench.nexmark.queries import QUERIES as KF_QUERIES

    run_id = uuid.uuid4().hex[:8]
    cores = os.cpu_count() or 1
    result = NexmarkResult(events, seed, cores, partitions, machine=machine())
    result.versions = {"pyspark": pyspark.__version__, "flink": f"pyflink {FLINK_VERSION}"}
    topics = {kind: f"nexmark.{run_id}.{kind}" for kind in KINDS}
    made = list(topics.values())
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        for topic in topics.values():
            create_topic(settings.kafka, topic, partitions=partitions)
        say(f"generating {events:,} Nexmark events (seed {seed})")
        produced = produce(
            settings.kafka.client_config(),
            topics,
            events=events,
            seed=seed,
            base_time_ms=1_795_000_000_000,
        )
        result.produced = produced.__dict__
        say(f"generated {produced.events} in {produced.seconds:g}s")
        dests = {
            (engine, q): f"nexmark.{run_id}.{engine}.{q}" for engine in engines for q in queries
        }
        for topic in dests.values():
            create_topic(settings.kafka, topic, partitions=partitions)
            made.append(topic)
        runs = {q: QueryRun(q, sum(produced.events[kind] for kind in READS[q])) for q in queries}
        if "kappaflow" in engines:
            for q in queries:
                if q not in KF_QUERIES:
                    runs[q].engines["kappaflow"] = {"skipped": MISSING[q]}
                    result.skipped[q] = MISSING[q]
                    continue
                say(f"kappaflow {q}")
                runs[q].engines["kappaflow"] = _kappaflow_query(
                    settings,
                    q,
                    run_id,
                    topics,
                    dests[("kappaflow", q)],
                    runs[q].events,
                    overrides,
                    out_dir,
                )
        if "flink" in engines:
            say(f"flink {', '.join(queries)}")
            times = _flink_queries(settings, run_id, queries, topics, dests, out_dir)
            for q in queries:
                runs[q].engines["flink"] = times[q]
        write_json(out_dir / "times.json", {q: r.engines for q, r in runs.items()})
        for q in queries:
            found = runs[q]
            rows: dict[str, list[dict[str, Any]]] = {}
            for engine, figures in found.engines.items():
                if not figures.get("seconds"):
                    continue
                seconds = float(figures["seconds"])
                rows[engine] = read_rows(settings.kafka, dests[(engine, q)])
                figures["rows"] = len(rows[engine])
                figures["events_per_s"] = round(found.events / seconds)
                figures["events_per_core_s"] = round(found.events / (cores * seconds))
            if len(rows) == 2:
                found.agreement = compare(q, rows["kappaflow"], rows["flink"])
                kf_s = found.engines["kappaflow"]["seconds"]
                found.ratio = round(found.engines["flink"]["seconds"] / kf_s, 4)
            result.queries.append(found)
            say(f"{q}: {json.dumps(found.engines)} agreement {found.agreement.get('agree')}")
    finally:
        for topic in made:
            with contextlib.suppress(TopicNotFoundError):
                delete_topic(settings.kafka, topic)
    ratios = [q.ratio for q in result.queries if q.ratio]
    if ratios:
        result.geomean_ratio = round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4)
    result.machine["load_average_at_end"] = os.getloadavg()
    write_json(out_dir / "result.json", result)
    return result


def _kappaflow_query(
    settings: Settings,
    query: str,
    run_id: str,
    topics: dict[str, str],
    dest: str,
    events: int,
    overrides: SettingsOverrides,
    out_dir: Path,
) -> dict[str, Any]:
    """The query's job over the events: Spark's time for its output's batches, from the
    first to the one that accounted for ``events`` (each batch's ``triggerExecution``,
    summed: batches run back to back), and the wall time from the job running to then."""
    name = f"nexmark-{query}-{run_id}"
    output = query
    jobs = JobManager(settings)
    params = {**topics, "dest": dest}
    try:
        jobs.start(name, f"kappaflow_bench.nexmark.queries:{query}", params, overrides=overrides)
        began = time.perf_counter()
        wait_for(
            lambda: True if _accounted(settings, name, output) >= events else None,
            timeout=QUERY_TIMEOUT_S,
            interval=0.25,
            what=f"kappaflow's {query} to read {events:,} events",
        )
        wall = time.perf_counter() - began
        status = json.loads((jobs.job_dir(name) / "outputs" / f"{output}.json").read_text())
        last = int(status["batch_id"])
        log = jobs.job_dir(name) / "driver.log"
        # The driver logs a line per finished batch within a second of its end.
        batches = wait_for(
            lambda: _batches(log, f"{name}.{output}", last),
            timeout=60,
            interval=0.5,
            what=f"the driver log's batches of {query}",
        )
        return {
            "seconds": round(sum(batches.values()) / 1000, 3),
            "wall_s": round(wall, 3),
            "batches": len(batches),
            "first_batch_s": batches[min(batches)] / 1000,
        }
    finally:
        if jobs.get_state(name) in ACTIVE_STATES:
            jobs.stop(name)
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(jobs.job_dir(name) / "driver.log", out_dir / f"kappaflow-{query}.log")
        with contextlib.suppress(KappaflowError):
            remove_job(settings, name)


#: The driver log's line per finished batch (jobs/runner.py ``_batch_line``).
_PROGRESS = re.compile(r"^progress (\S+) batch (\d+): (\d+) rows; ms .*?triggerExecution=(\d+)")


def _batches(log: Path, query: str, last: int) -> dict[int, int] | None:
    """Batch id -> triggerExecution ms of ``query``'s batches up to ``last``, once the
    log has them all."""
    found: dict[int, int] = {}
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        match = _PROGRESS.match(line)
        if match and match[1] == query and int(match[2]) <= last:
            found[int(match[2])] = int(match[4])
    return found if len(found) == last + 1 else None


def _accounted(settings: Settings, job: str, output: str) -> int:
    found = job_status(settings, job)
    if found["state"] in (JobState.FAILED, JobState.CRASHED):
        raise JobError(f"job {job} {found['state']}: {found['error']}")
    return int(found["outputs"].get(output, {}).get("events_read") or 0)


class NexmarkFlink(AppEngine):
    """The queries on Flink SQL (flink_app.py), in the Flink venv the YSB peer makes."""

    kind = "flink"
    label = "PyFlink"
    module = "kappaflow_bench.nexmark.flink_app"
    packages = FlinkEngine.packages
    start_timeout_s = 240.0

    def __init__(self, settings: Settings, name: str, spec: dict[str, Any]) -> None:
        super().__init__(settings, name, spec)
        self.spec = {
            **spec,
            "group": name,
            "kafka_options": settings.kafka.spark_kafka_options(),
            "parallelism": FLINK_PARALLELISM,
            "tmp_dir": str(self.home / "state" / name),
        }

    def start(self) -> None:
        jars = flink_connector_jars(self.settings)
        self.spec["jars"] = [jar.resolve().as_uri() for jar in jars]
        Path(self.spec["tmp_dir"]).mkdir(parents=True, exist_ok=True)
        super().start()

    def app_env(self) -> dict[str, str]:
        return {**super().app_env(), "FLINK_LOG_DIR": self.spec["tmp_dir"]}

    def lines(self) -> list[dict[str, Any]]:
        """The app's lines of results so far; fails if it exited before it was done."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        assert self._proc is not None
        if "flink app done" not in text and self._proc.poll() is not None:
            last = (text.strip().splitlines() or ["?"])[-1]
            raise JobError(f"the Flink app exited: {last}")
        return [json.loads(line) for line in text.splitlines() if line.startswith('{"query"')]

    def done(self) -> bool:
        return "flink app done" in (self.log.read_text(errors="replace"))

    def stop(self, log_to: Path) -> None:
        super().stop(log_to)
        tmp = Path(self.spec["tmp_dir"])
        for flink_log in sorted(tmp.glob("*.log"))[-1:]:
            shutil.copyfile(flink_log, log_to.with_name("flink.log"))
        shutil.rmtree(tmp, ignore_errors=True)


def _flink_queries(
    settings: Settings,
    run_id: str,
    queries: list[str],
    topics: dict[str, str],
    dests: dict[tuple[str, str], str],
    out_dir: Path,
) -> dict[str, dict[str, Any]]:
    spec = {
        "topics": topics,
        "queries": queries,
        "dests": {q: dests[("flink", q)] for q in queries},
    }
    app = NexmarkFlink(settings, f"nexmark-flink-{run_id}", spec)

    def finished() -> bool | None:
        app.lines()  # fails if the app exited early
        return True if app.done() else None

    try:
        app.start()
        wait_for(
            finished,
            timeout=QUERY_TIMEOUT_S * len(queries),
            interval=1.0,
            what="Flink to run the queries",
        )
        found = {line["query"]: line for line in app.lines()}
    finally:
        app.stop(out_dir / "flink-app.log")
    times: dict[str, dict[str, Any]] = {}
    for q in queries:
        line = found.get(q)
        if line is None or "net_runtime_ms" not in line:
            times[q] = {"error": (line or {}).get("error", "no result")}
        else:
            times[q] = {"seconds": line["net_runtime_ms"] / 1000, "wall_s": line["wall_s"]}
    return times
