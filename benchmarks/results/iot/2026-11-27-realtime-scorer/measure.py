"""Latency of the real-time scoring job (kappaflow.iot.realtime) alone, on this machine.

Creates the run's topics, sends a model for each of N series, starts the job, then sends
readings (clean, one series after another) at each rate for SECONDS, each stamped with
its send time, and reads the scores as they come (read_committed consumer, a poll loop
between sends). Prints, per rate, sent and scored counts and send -> receipt p50 / p99 /
max (ms), over the whole window and per 10 s. Run with kappaflow's services up (the
KAPPAFLOW_* settings of the shell), from the repository:

    python measure.py RUN SERIES RATE[,RATE...] SECONDS
"""

import json
import math
import subprocess
import sys
import time
from datetime import UTC, datetime

from confluent_kafka import Consumer, Producer

from kappaflow.iot.models import MODELS
from kappaflow.kafka.topics import create_topic
from kappaflow.settings import load_settings

run, series, rates, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
settings = load_settings()
clean, models, scores = f"{run}.clean", f"{run}.models", f"{run}.scores"
create_topic(settings.kafka, clean, partitions=2, exist_ok=True)
create_topic(settings.kafka, models, partitions=1, exist_ok=True)
producer = Producer(settings.kafka.client_config())
trainer = MODELS["forecast"].trainer()
base = [50 + 8 * math.sin(2 * math.pi * i / 1440) + 0.5 * math.sin(i) for i in range(600)]
params = json.dumps(trainer.learn(base))
for s in range(series):
    model = {"device": f"dev-{s:05d}", "metric": "cpu_temp", "model": "forecast", "version": 1,
             "learnt": 600, "trained_until": "2026-11-27T00:00:00Z", "params": params}
    producer.produce(models, key=json.dumps([model["device"], "cpu_temp"]), value=json.dumps(model))
producer.flush()
kf = [sys.executable, "-m", "kappaflow"]
started = subprocess.run([*kf, "jobs", "start", run, "--app", "kappaflow.iot.realtime:PIPELINE",
                          "-P", f"source={clean}", "-P", f"models={models}", "-P", f"dest={scores}"],
                         capture_output=True, text=True)
print(started.stderr.strip().splitlines()[-1], flush=True)
consumer = Consumer({**settings.kafka.client_config(), "group.id": f"{run}-reader",
                     "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
consumer.subscribe([scores])
sent_at: dict[str, float] = {}
latency: list[tuple[float, float]] = []


def drain(until: float) -> None:
    while True:
        message = consumer.poll(max(0.0, min(0.005, until - time.time())))
        if message is not None and message.error() is None:
            score = json.loads(message.value())
            if score["id"] in sent_at:
                latency.append((sent_at[score["id"]], (time.time() - sent_at[score["id"]]) * 1000))
        if time.time() >= until:
            return


def warm() -> None:
    """Readings until one comes back scored: the query's first batch has started."""
    n = 0
    while not latency:
        rid = f"warm/{n}"
        sent_at[rid] = time.time()
        reading = {"device": "dev-00000", "metric": "cpu_temp", "value": 50.0, "unit": "celsius",
                   "time": datetime.now(UTC).isoformat(), "seq": n, "id": rid}
        producer.produce(clean, key="dev-00000", value=json.dumps(reading))
        producer.poll(0)
        n += 1
        drain(time.time() + 0.5)


warm()
seq = 0
for rate in [int(r) for r in rates.split(",")]:
    latency.clear()
    begin = time.time()
    count = 0
    while time.time() - begin < seconds:
        due = begin + count / rate
        drain(due)
        device = f"dev-{count % series:05d}"
        rid = f"{rate}/{count}"
        now = time.time()
        sent_at[rid] = now
        reading = {"device": device, "metric": "cpu_temp", "value": base[count % 600],
                   "unit": "celsius", "time": datetime.fromtimestamp(now, UTC).isoformat(),
                   "seq": count, "id": rid}
        producer.produce(clean, key=device, value=json.dumps(reading))
        producer.poll(0)
        count += 1
    producer.flush()
    drain(time.time() + 10)
    got = sorted(ms for _, ms in latency)
    print(f"rate {rate}/s: sent {count}, scored {len(got)}, p50 {got[len(got) // 2]:.1f} ms, "
          f"p99 {got[int(len(got) * 0.99)]:.1f} ms, max {got[-1]:.1f} ms", flush=True)
    for window in range(int(seconds // 10)):
        part = sorted(ms for at, ms in latency if begin + 10 * window <= at < begin + 10 * (window + 1))
        if part:
            print(f"  {10 * window:3d}-{10 * window + 10:3d} s: n {len(part)}, p50 {part[len(part) // 2]:.1f}, "
                  f"p99 {part[int(len(part) * 0.99)]:.1f}, max {part[-1]:.1f}", flush=True)
subprocess.run([*kf, "jobs", "stop", run], capture_output=True)
subprocess.run([*kf, "jobs", "remove", run], capture_output=True)
