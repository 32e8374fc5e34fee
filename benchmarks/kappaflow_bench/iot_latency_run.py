"""A run of ``kappaflow-bench iot-latency``: the topics, the fleet registered, the two jobs,
the generator and the reader of the outputs; what is measured, and how it is read back,
is in ``iot_latency``.

The application runs on topics of the run's own (``bench.latency.<run>.*``) as jobs of
``kappaflow.iot.app:build``: cleaning, alerting and device state in one (``-P
parts=clean,alerts,devices``), the trainer in another (``-P parts=train``), so that the
trainer can be stopped while the rest runs on; the scorer is the real-time one, a job of
its own (``kappaflow.iot.realtime:PIPELINE`` on the raw readings, scorer ``realtime``),
or the micro-batch part in the first job (scorer ``batch``). With alerts ``apart``, the
alerting part is a job of its own too (``-P parts=alerts``), with a driver of its own.

The generator is the simulator's fleet (``kappaflow.iot.simulator``: its values, with
anomalies often enough that alerts come within the run), advanced to the wall clock in
steps of ``STEP_S`` and sent with the product's producer (idempotent, acks=all) straight
to the raw topic, each reading stamped with the moment it is sent. Without the faults
that would blur a latency: clock skew, readings held back, duplicates, silences.

The reader of the outputs (``iot_latency.watch``) runs in a process of its own, so that
its CPU is not the generator's: a ``read_committed`` consumer of ``scores``, ``alerts``
and ``models`` from their beginning, writing a CSV line a record (its log append time,
when it was read, its event time and what the figures need) to
``<state_dir>/bench-iot-latency/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import (
    KafkaError,
    Message,
)

from kappaflow import services
from kappaflow.errors import JobError, JobNotFoundError, ServiceExitedError
from kappaflow.iot.registry import fleet_tokens, register
from kappaflow.iot.simulator import FleetConfig, Simulation, device_names
from kappaflow.iot.telemetry import METRICS, READINGS_TOPIC
from kappaflow.jobs.manager import ACTIVE_STATES, START_TIMEOUT_S, JobManager, JobState
from kappaflow.jobs.removal import remove_job
from kappaflow.kafka.clients import producer
from kappaflow.kafka.records import produce_with_retry
from kappaflow.kafka.topics import (
    COMPACTED,
    DEFAULT_PARTITIONS,
    create_topic,
    delete_topic,
    list_topics,
)
from kappaflow.settings import KafkaSettings, Settings, SettingsOverrides
from kappaflow.waiting import wait_for
from kappaflow_bench.iot_latency import (
    MATURE_SHARE,
    PHASES,
    TIMELINE_COLUMNS,
    LatencyBenchResult,
    Snapshot,
    Window,
    cpu_seconds,
    fill,
    process_tree,
    ratios,
    read_records,
    summary,
    timeline,
    watch,
)
from kappaflow_bench.report import machine, write_json

APP = "kappaflow.iot.app:build"
REALTIME = "kappaflow.iot.realtime:PIPELINE"
#: The scorers a run can measure, and where its alerting part can run.
SCORERS = ("realtime", "batch")
ALERTS = ("app", "apart", "realtime")
#: The alerting job in real-time mode (alerts ``realtime``).
REALTIME_ALERTS = "kappaflow.iot.alerts:build_realtime"
#: Anomalies a day per device and metric: many, so that alerts come within minutes (the
#: demo's figure).
ANOMALIES_PER_DAY = 48.0
#: How often the generator advances the fleet and sends what it sampled: each reading is
#: stamped when it is sent, so the step sets how bursty the sending is, not the latency.
STEP_S = 0.01
#: Records stamped by the broker when appended: event → log is one clock's difference.
LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
#: How long the run waits, once the generator stops, for the last readings' scores; and
#: how long without a new score ends the wait sooner (longer than a micro-batch of a
#: busy two-core machine, which can take a minute).
DRAIN_S, QUIET_S = 240.0, 90.0
#: How often the run checks that the jobs, the generator and the reader are alive.
CHECK_S = 1.0
#: Readings a second while the jobs start, and how long the app runs on them before
#: the trainer starts (its queries' first batches: scores, then alerts).
START_RATE, START_SETTLE_S = 100.0, 15.0
#: How long the models may take to learn their warm-up (``MATURE_SHARE``).
MATURE_TIMEOUT_S = 900.0


# The generator.


def _stamp(epoch_s: float) -> bytes:
    """``epoch_s`` as the simulator stamps readings: ISO-8601 UTC, milliseconds, ``Z``."""
    ms = int(epoch_s * 1000)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
    ).encode()


_TIME = b'"time": "'


def _restamped(value: bytes, stamp: bytes) -> bytes:
    """A reading's JSON (as the simulator writes it) with ``time`` set to ``stamp``."""
    at = value.index(_TIME) + len(_TIME)
    return value[:at] + stamp + value[value.index(b'"', at) :]


class Generator:
    """The fleet's readings into ``raw`` and its device events into ``events`` at ``rate``
    readings a second (changed as it runs), in a thread of its own."""

    def __init__(
        self, kafka: KafkaSettings, raw: str, events: str, devices: int, rate: float, seed: int
    ) -> None:
        self.config = FleetConfig(
            devices=devices,
            rate=rate,
            seed=seed,
            anomalies_per_day=ANOMALIES_PER_DAY,
            skewed_share=0.0,
            late_share=0.0,
            duplicate_share=0.0,
            silences_per_day=0.0,
        )
        self.rate = rate
        self.raw, self.events = raw, events
        self.client = producer(kafka, acks="all")
        self.timeout_s = kafka.timeout_s
        #: Readings produced, acknowledged by Kafka, and their bytes.
        self.sent = self.acked = self.bytes = 0
        self.failures: list[str] = []
        self.steps = 0
        #: Readings produced in each second of the wall clock (epoch s).
        self.per_second: dict[int, int] = {}
        #: The longest time between two steps (s): how far the generator fell behind.
        self.longest_step_s = 0.0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="generator", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.failures:
            raise JobError(f"sending readings failed: {self.failures[0]}")

    def _reading(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.acked += 1
        else:
            self.failures.append(err.str())

    def _event(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failures.append(err.str())

    def _run(self) -> None:
        # Delivery reports come in poll(), in this thread: the counters need no lock.
        try:
            # At the rate of the start: a fleet started at one rate and slowed at once
            # would send each round of every device within the first rate's interval.
            config = dataclasses.replace(self.config, rate=self.rate)
            simulation = Simulation(config, time.time())
            last = time.monotonic()
            while not self._stop.is_set():
                if simulation.config.rate != self.rate:
                    # The next rounds are spaced for the new rate (FleetConfig.interval_s).
                    simulation.config = dataclasses.replace(simulation.config, rate=self.rate)
                records, _labels = simulation.advance(time.time())
                sent_at = time.time()
                stamp = _stamp(sent_at)
                before = self.sent
                for r in records:
                    if r.topic == READINGS_TOPIC:
                        value = _restamped(r.value, stamp)
                        produce_with_retry(
                            self.client, self.raw, value, r.key, on_delivery=self._reading
                        )
                        self.sent += 1
                        self.bytes += len(value)
                    else:
                        produce_with_retry(
                            self.client, self.events, r.value, r.key, on_delivery=self._event
                        )
                second = int(sent_at)
                self.per_second[second] = self.per_second.get(second, 0) + self.sent - before
                self.client.poll(0)
                now = time.monotonic()
                self.steps += 1
                self.longest_step_s = max(self.longest_step_s, now - last)
                last = now
                self._stop.wait(STEP_S)
        except BaseException as exc:  # raised again in the run's thread by check()
            self.error = exc
        finally:
            self.client.flush(self.timeout_s * 3)

    def to_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "acknowledged": self.acked,
            "failures": len(self.failures),
            "steps": self.steps,
            "longest_step_s": round(self.longest_step_s, 3),
            "step_s": STEP_S,
        }


def _uptime() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


# The run.


class LatencyRun:
    """The topics, the jobs, the generator and the reader of one run."""

    def __init__(
        self,
        settings: Settings,
        overrides: SettingsOverrides,
        config_file: Path | None,
        devices: int,
        rate: float,
        seed: int,
        scorer: str = "realtime",
        alerts: str = "app",
    ) -> None:
        self.settings, self.overrides, self.config_file = settings, overrides, config_file
        self.scorer = scorer
        self.fleet = device_names(devices)
        run_id = uuid.uuid4().hex[:6]
        self.prefix = f"bench.latency.{run_id}."
        t = {
            name: f"{self.prefix}{name}"
            for name in (
                "telemetry.raw",
                "devices.events",
                "devices.registry",
                "telemetry.clean",
                "models",
                "scores",
                "alerts",
                "devices.status",
            )
        }
        self.topics = t
        self.app, self.trainer = f"bench-latency-{run_id}", f"bench-latency-{run_id}-train"
        self.scoring = f"bench-latency-{run_id}-score" if scorer == "realtime" else None
        self.alerting = f"bench-latency-{run_id}-alerts" if alerts != "app" else None
        self.alerts_realtime = alerts == "realtime"
        scoring = {"source": t["telemetry.clean"], "models": t["models"], "dest": t["scores"]}
        if self.scoring:
            # Raw readings, scored as they reach Kafka, as the cleaning job would pass them.
            scoring.update(
                source=t["telemetry.raw"], readings="raw", registry=t["devices.registry"]
            )
        alerting = {"alerts.source": t["scores"], "alerts.dest": t["alerts"]}
        self.params = {
            self.app: {
                "parts": ",".join(
                    part
                    for part, wanted in (
                        ("clean", True),
                        ("score", not self.scoring),
                        ("alerts", not self.alerting),
                        ("devices", True),
                    )
                    if wanted
                ),
                "clean.source": t["telemetry.raw"],
                "clean.dest": t["telemetry.clean"],
                "clean.registry": t["devices.registry"],
                **({} if self.scoring else {f"score.{k}": v for k, v in scoring.items()}),
                **({} if self.alerting else alerting),
                "devices.events": t["devices.events"],
                "devices.source": t["telemetry.clean"],
                "devices.status": t["devices.status"],
            },
            self.trainer: {
                "parts": "train",
                "train.source": t["telemetry.clean"],
                "train.dest": t["models"],
            },
            **({self.scoring: scoring} if self.scoring else {}),
            **(
                {self.alerting: {"source": t["scores"], "dest": t["alerts"]}}
                if self.alerts_realtime and self.alerting
                else {self.alerting: {"parts": "alerts", **alerting}}
                if self.alerting
                else {}
            ),
        }
        self.jobs = JobManager(settings)
        self.home = settings.state_dir / "bench-iot-latency"
        self.records_path = self.home / f"{run_id}.csv"
        self.generator = Generator(
            settings.kafka, t["telemetry.raw"], t["devices.events"], devices, rate, seed
        )
        self.trainer_running = False
        #: (wall ms, what happened).
        self.marks: list[tuple[int, str]] = []
        self.logs: dict[str, list[str]] = {}
        self._services: dict[str, int | None] = {}
        self._reader: Any = None
        self._stop_reader: Any = None
        self._seen: Any = None

    # Setting up and tearing down.

    @contextlib.contextmanager
    def running(self, say: Callable[[str], None]) -> Iterator[LatencyRun]:
        """The topics, the fleet registered, the jobs running and the reader reading;
        all stopped and removed again afterwards, the jobs' logs kept in ``logs``."""
        kafka, t = self.settings.kafka, self.topics
        try:
            for name in ("telemetry.raw", "devices.events", "telemetry.clean", "devices.status"):
                create_topic(kafka, t[name], partitions=DEFAULT_PARTITIONS)
            # Stamped by the broker: event → append is one clock's difference. The job
            # leaves a topic that exists as it is.
            for name in ("scores", "alerts"):
                create_topic(kafka, t[name], partitions=DEFAULT_PARTITIONS, configs=LOG_APPEND_TIME)
            create_topic(
                kafka,
                t["models"],
                partitions=DEFAULT_PARTITIONS,
                configs={**COMPACTED, **LOG_APPEND_TIME},
            )
            # What `kappaflow iot register --fleet N` does: the state directory's tokens.
            tokens, _new = fleet_tokens(self.settings.state_dir / "iot" / "tokens.json", self.fleet)
            register(kafka, tokens, topic=t["devices.registry"])
            say(f"{len(self.fleet)} devices registered; topics {self.prefix}*")
            self._start_reader()
            self._services = {
                row.service: row.pid
                for row in services.status(self.settings)
                if row.pid and row.service in ("kafka", "redis")
            }
            yield self
        finally:
            self._tear_down(say)

    def start_app(self, say: Callable[[str], None]) -> None:
        for name in self._always():
            self._start_job(name)
            say(f"job {name} running")

    def _always(self) -> tuple[str, ...]:
        """The jobs that run from start to end: all but the trainer."""
        return tuple(name for name in (self.app, self.scoring, self.alerting) if name)

    def start_trainer(self, say: Callable[[str], None]) -> None:
        self._start_job(self.trainer)
        self.trainer_running = True
        say(f"job {self.trainer} running")

    def _start_job(self, name: str) -> None:
        real_time_alerts = self.alerts_realtime and name == self.alerting
        self.jobs.start(
            name,
            REALTIME if name == self.scoring else REALTIME_ALERTS if real_time_alerts else APP,
            self.params[name],
            overrides=self.overrides,
            config_file=self.config_file,
            timeout=START_TIMEOUT_S * 2,
            real_time=real_time_alerts,
        )

    def wait_for_output(self, output: int, what: str) -> None:
        """Until the reader has read a record of ``output`` (0 scores, 1 alerts, 2 models)."""

        def found() -> bool | None:
            self.check()
            return True if self._seen[output] > 0 else None

        wait_for(found, timeout=START_TIMEOUT_S, interval=0.5, what=what)

    def wait_for_mature_models(self, timeout_s: float) -> None:
        """Until ``MATURE_SHARE`` of the fleet's series have a model that has learnt its
        ``WARMUP`` readings (one short of them scores every reading 0)."""
        series = len(self.fleet) * len(METRICS)

        def mature() -> bool | None:
            self.check()
            return True if self._seen[3] >= MATURE_SHARE * series else None

        wait_for(mature, timeout=timeout_s, interval=0.5, what="models that have learnt")

    def _start_reader(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        # Spawned, not forked: this process has librdkafka's threads running.
        spawn = multiprocessing.get_context("spawn")
        self._stop_reader = spawn.Event()
        self._seen = spawn.Array("q", 4)
        topics = (self.topics["scores"], self.topics["alerts"], self.topics["models"])
        self._reader = spawn.Process(
            target=watch,
            args=(
                self.settings.kafka,
                topics,
                str(self.records_path),
                self._stop_reader,
                self._seen,
            ),
            name="iot-latency-reader",
            daemon=True,
        )
        self._reader.start()

    def stop_reader(self) -> None:
        if self._reader is not None and self._reader.is_alive():
            self._stop_reader.set()
            self._reader.join(timeout=60)
            if self._reader.is_alive():
                self._reader.kill()
                self._reader.join()

    def _tear_down(self, say: Callable[[str], None]) -> None:
        with contextlib.suppress(Exception):
            self.generator.stop()
        self.stop_reader()
        for name, label in self._labels():
            if self.jobs.get_state(name) in ACTIVE_STATES:
                with contextlib.suppress(JobError):
                    self.jobs.stop(name)
                    say(f"job {name} stopped")
            log = self.jobs.job_dir(name) / "driver.log"
            with contextlib.suppress(OSError):
                self.logs[label] = log.read_text(errors="replace").splitlines()
                # Kept where a failed run leaves them, too.
                (self.home / f"{label}-driver.log").write_text(log.read_text(errors="replace"))
            with contextlib.suppress(JobNotFoundError, JobError):
                remove_job(self.settings, name)
        existing = {t["name"] for t in list_topics(self.settings.kafka)}
        for topic in sorted(existing):
            if topic.startswith(self.prefix):
                delete_topic(self.settings.kafka, topic)
        say(f"jobs removed, topics {self.prefix}* deleted")

    # While it runs.

    def check(self) -> None:
        """Raise if the generator failed, the reader died or a job stopped running."""
        self.generator.check()
        if self._reader is not None and not self._reader.is_alive():
            raise ServiceExitedError(
                f"the reader of the outputs exited ({self._reader.exitcode}); see stderr"
            )
        for name in (*self._always(), *((self.trainer,) if self.trainer_running else ())):
            state = self.jobs.get_state(name)
            if state is not JobState.RUNNING:
                lines = " | ".join(self.jobs.log_lines(name, 5))
                raise JobError(f"job {name} is {state}: {lines}")

    def hold(self, seconds: float) -> None:
        """Let the run go on for ``seconds``, checking it every ``CHECK_S``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(CHECK_S, left))
            self.check()

    def mark(self, text: str) -> None:
        self.marks.append((int(time.time() * 1000), text))

    def snapshot(self) -> Snapshot:
        trainer = self.jobs.get(self.trainer).pid if self.trainer_running else None
        processes = {
            "generator": process_tree(os.getpid(), children=False),
            "reader": process_tree(self._reader.pid if self._reader else None),
            "app job": process_tree(self.jobs.get(self.app).pid),
            "scorer job": process_tree(self.jobs.get(self.scoring).pid if self.scoring else None),
            "alerts job": process_tree(self.jobs.get(self.alerting).pid if self.alerting else None),
            "trainer job": process_tree(trainer),
            **{name: process_tree(pid) for name, pid in self._services.items()},
        }
        lines = {}
        for name, label in self._labels():
            log = self.jobs.job_dir(name) / "driver.log"
            with contextlib.suppress(OSError), log.open("rb") as text:
                lines[label] = sum(1 for _ in text)
        return Snapshot(
            wall_ms=int(time.time() * 1000),
            acked=self.generator.acked,
            cpu={name: cpu_seconds(procs) for name, procs in processes.items()},
            machine=psutil.cpu_times(),
            log_lines=lines,
        )

    def measure(self, phase: str, rate: float, seconds: float) -> tuple[Window, Snapshot, Snapshot]:
        window = Window(phase, rate, load_average_at_start=list(os.getloadavg()))
        self.mark(f"{phase} at {rate:g}/s: measuring")
        first = self.snapshot()
        self.hold(seconds)
        last = self.snapshot()
        self.mark(f"{phase} at {rate:g}/s: measured")
        return window, first, last

    def _labels(self) -> list[tuple[str, str]]:
        """Each job with the label of its figures and logs."""
        named = [(self.trainer, "trainer"), (self.app, "app")]
        named += [(self.scoring, "scorer")] if self.scoring else []
        return named + ([(self.alerting, "alerts")] if self.alerting else [])

    def stop_trainer(self) -> float:
        """Stop the trainer job; the seconds it took."""
        self.mark("trainer stop asked")
        began = time.monotonic()
        self.trainer_running = False
        self.jobs.stop(self.trainer)
        self.mark("trainer stopped")
        return time.monotonic() - began

    def drain(self) -> float:
        """Once the generator stopped: wait for every acknowledged reading's score, or
        until no score came for ``QUIET_S`` (a reading refused by the cleaning job never
        has one)."""
        began = time.monotonic()
        progress = [self._seen[0], began]

        def done() -> bool | None:
            seen, now = self._seen[0], time.monotonic()
            if seen != progress[0]:
                progress[:] = [seen, now]
            return True if seen >= self.generator.acked or now - progress[1] > QUIET_S else None

        with contextlib.suppress(TimeoutError):
            wait_for(done, timeout=DRAIN_S, interval=0.5, what="the last readings' scores")
        return time.monotonic() - began


def run(
    settings: Settings,
    overrides: SettingsOverrides,
    config_file: Path | None,
    *,
    devices: int,
    rates: list[float],
    warmup_s: float,
    settle_s: float,
    duration_s: float,
    seed: int,
    out_dir: Path,
    say: Callable[[str], None],
    scorer: str = "realtime",
    alerts: str = "app",
) -> LatencyBenchResult:
    """Each rate with the trainer running, then each again with the trainer stopped; the
    figures, also written to ``out_dir`` (``result.json``, ``summary.md``,
    ``timeline.csv``, the jobs' driver logs)."""
    result = LatencyBenchResult(
        devices=devices,
        rates=rates,
        warmup_s=warmup_s,
        settle_s=settle_s,
        duration_s=duration_s,
        anomalies_per_day=ANOMALIES_PER_DAY,
        partitions=DEFAULT_PARTITIONS,
        scorer=scorer,
        alerts_in=alerts,
        machine=machine(),
        uptime_at_start=_uptime(),
    )
    bench = LatencyRun(settings, overrides, config_file, devices, rates[0], seed, scorer, alerts)
    measured: list[tuple[Window, Snapshot, Snapshot]] = []
    stop_asked_ms = 0
    with bench.running(say):
        # One job after the other, each running on a trickle of readings before the
        # next starts: a query's first batch starts Python workers on the driver, which
        # Spark gives 10 s to connect back; a machine busy starting a second JVM, or
        # with readings at full rate, can make them miss it.
        bench.start_app(say)
        bench.generator.rate = START_RATE
        bench.generator.start()
        bench.mark("generator started")
        bench.wait_for_output(0, "the first scores")
        bench.hold(START_SETTLE_S)
        bench.start_trainer(say)
        bench.wait_for_output(2, "the first model updates")
        bench.mark("trainer running")
        say(f"sending {rates[0]:,.0f} readings/s; warming up for {warmup_s:g} s")
        bench.generator.rate = rates[0]
        first_model = time.monotonic()
        bench.hold(warmup_s)
        # Measured on models that score: each series' model learns WARMUP readings first.
        bench.wait_for_mature_models(MATURE_TIMEOUT_S)
        bench.mark("models mature")
        result.models_mature_s = round(time.monotonic() - first_model, 1)
        say(f"models of {MATURE_SHARE:.0%} of the series mature after {result.models_mature_s:g} s")
        for i, rate in enumerate(rates):
            bench.generator.rate = rate
            if i:
                bench.hold(settle_s)
            measured.append(bench.measure(PHASES[0], rate, duration_s))
            say(f"{PHASES[0]}, {rate:,.0f}/s: measured")
        stop_asked_ms = int(time.time() * 1000)
        result.trainer_stop_s = round(bench.stop_trainer(), 1)
        say(f"trainer stopped in {result.trainer_stop_s:g} s")
        for rate in rates:
            bench.generator.rate = rate
            bench.hold(settle_s)
            measured.append(bench.measure(PHASES[1], rate, duration_s))
            say(f"{PHASES[1]}, {rate:,.0f}/s: measured")
        bench.generator.stop()
        bench.mark("generator stopped")
        result.drain_s = round(bench.drain(), 1)
        bench.stop_reader()
    records = read_records(bench.records_path)
    for window, first, last in measured:
        fill(window, first, last, records, bench.logs)
        result.windows.append(window)
    result.ratios = ratios(result.windows)
    generator = bench.generator
    result.generator = generator.to_json()
    result.reading_bytes = round(generator.bytes / generator.sent, 1) if generator.sent else 0.0
    result.readings_sent = generator.acked
    result.readings_scored = len(records.scores)
    result.alerts = dict(sorted(Counter(records.alert_kinds).items()))
    result.scores_high = records.high
    if len(records.models):
        result.last_model_update_after_stop_s = round(
            (int(records.models.max()) - stop_asked_ms) / 1000, 1
        )
    result.jobs = {
        "app": bench.app,
        "scorer": bench.scoring,
        "alerts": bench.alerting,
        "trainer": bench.trainer,
        "params": bench.params,
    }
    result.machine["load_average_at_end"] = os.getloadavg()
    result.uptime_at_end = _uptime()
    _write(out_dir, result, timeline(records, bench.generator.per_second, bench.marks), bench.logs)
    bench.records_path.unlink(missing_ok=True)
    return result


def _write(
    out_dir: Path,
    result: LatencyBenchResult,
    seconds: list[list[object]],
    logs: dict[str, list[str]],
) -> None:
    write_json(out_dir / "result.json", result)
    (out_dir / "summary.md").write_text(summary(result))
    lines = [",".join(TIMELINE_COLUMNS)]
    lines += [",".join("" if v is None else str(v) for v in row) for row in seconds]
    (out_dir / "timeline.csv").write_text("\n".join(lines) + "\n")
    for label, text in logs.items():
        (out_dir / f"{label}-driver.log").write_text("\n".join(text) + "\n")
