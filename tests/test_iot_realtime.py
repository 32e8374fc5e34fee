"""The real-time scoring job (kappaflow.iot.realtime) on the broker: every reading scored
once, as the Python scorer scores it with the parameters the job had, through a model
update, bad records and a restart."""

from __future__ import annotations

import base64
import itertools
import json
import uuid
from collections import defaultdict
from datetime import datetime
from typing import Any

from confluent_kafka import Producer
from conftest import RunCli, error_line
from live_jobs import send_json, topic_values

from kappaflow.iot.models import MODELS, Scorer
from kappaflow.iot.registry import register
from kappaflow.kafka.topics import create_topic, list_topics
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for
from test_iot_learning import noise, readings

FORECAST, ROBUST = ("d1", "cpu_temp"), ("d1", "room_temp")


def _model(key: tuple[str, str], family: str, version: int, values: list[float]) -> dict[str, Any]:
    params = MODELS[family].trainer().learn(values)
    return {
        "device": key[0],
        "metric": key[1],
        "model": family,
        "version": version,
        "learnt": len(values),
        "trained_until": "2026-11-20T00:00:00+00:00",
        "params": json.dumps(params),
    }


def test_each_reading_is_scored_as_it_arrives_with_the_newest_parameters_and_after_a_restart(
    cli: RunCli, kafka: Settings
) -> None:
    job = f"rt-{uuid.uuid4().hex[:8]}"
    clean, models, scores = f"{job}-clean", f"{job}-models", f"{job}-scores"
    create_topic(kafka.kafka, clean, partitions=2)
    create_topic(kafka.kafka, models, partitions=1)
    start = ("jobs", "start", job, "--app", "kappaflow.iot.realtime:PIPELINE")
    topics = ("-P", f"source={clean}", "-P", f"models={models}", "-P", f"dest={scores}")
    started = cli(*start, *topics)
    assert started.code == 0, started.err
    history = {FORECAST: noise(400, 3), ROBUST: noise(400, 4)}
    given = {
        FORECAST: _model(FORECAST, "forecast", 1, history[FORECAST][:300]),
        ROBUST: _model(ROBUST, "robust", 1, history[ROBUST][:300]),
    }
    broken = {**_model(("d2", "cpu_temp"), "forecast", 1, noise(60, 5)), "params": "{not json"}
    unknown = _model(("d3", "cpu_temp"), "forecast", 1, noise(60, 5))
    unknown["params"] = json.dumps({**json.loads(unknown["params"]), "model": "hst"})
    send_json(kafka, models, [*given.values(), broken, unknown], key="device")
    send_json(kafka, clean, [b"{not a reading"], key="device")
    send_json(kafka, models, [b"{not a model"], key="device")
    sent: list[dict[str, Any]] = []
    row = {FORECAST: 300, ROBUST: 300}

    def send(key: tuple[str, str], count: int) -> None:
        batch = readings(*key, history[key][row[key] : row[key] + count], first=row[key])
        row[key] += count
        sent.extend(batch)
        send_json(kafka, clean, batch, key="device")

    def scored_by_id() -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for score in topic_values(kafka, scores):
            found[score["id"]].append(score)
        return found

    def until_version(key: tuple[str, str], version: int) -> None:
        """Readings of ``key`` one at a time until one is scored with ``version``."""

        def probe() -> bool | None:
            send(key, 1)
            last = scored_by_id().get(sent[-1]["id"])
            return True if last and last[0]["model_version"] == version else None

        wait_for(probe, timeout=180, interval=0.5, what=f"{key} scored with version {version}")

    def all_scored(what: str, timeout: float = 60) -> None:
        wanted = {r["id"] for r in sent}
        wait_for(
            lambda: True if set(scored_by_id()) == wanted else None,
            timeout=timeout,
            what=f"every reading scored {what}",
        )

    until_version(FORECAST, 1)
    until_version(ROBUST, 1)
    send(FORECAST, 40)
    send(ROBUST, 40)
    all_scored("with the first models")
    # A newer model for one key, then an older one again, which changes nothing.
    newer = _model(FORECAST, "forecast", 2, history[FORECAST][:340])
    # And a broken record of an older version: a dead letter all the same.
    stale_broken = {**given[FORECAST], "params": "{not json"}
    send_json(kafka, models, [newer, given[FORECAST], stale_broken], key="device")
    until_version(FORECAST, 2)
    send(FORECAST, 10)
    send(ROBUST, 10)
    all_scored("after the update")
    before = scored_by_id()
    assert all(len(s) == 1 for s in before.values()), "a reading was scored twice"
    scored_before_restart = len(before)

    # A restart: the job scores on from its checkpoint (again what its last real-time
    # batch had read, with the same scores: at least once).
    assert cli("jobs", "stop", job).code == 0
    assert cli(*start, *topics).code == 0
    send(FORECAST, 20)
    send(ROBUST, 20)
    all_scored("after the restart", timeout=180)
    records = topic_values(kafka, scores)
    assert cli("jobs", "stop", job).code == 0
    assert {r["id"] for r in records} == {r["id"] for r in sent}
    # A key's scores are in one partition, in the order the job scored its readings:
    # those of the first run, then, from the restart, again those after the checkpoint
    # the job restarted from, then the new ones. Each run's sequence is what the Python
    # scorer gives, from the same memory, with the parameters the job had for each.
    values = {r["id"]: r["value"] for r in sent}
    replayed = 0
    for key in history:
        mine = [r for r in records if (r["device"], r["metric"]) == key]
        ids = [r["id"] for r in mine]
        again = next((j for j, i in enumerate(ids) if i in ids[:j]), len(mine))
        first_run = mine[:again]
        runs = [first_run]
        if again < len(mine):
            resumed = ids.index(ids[again])
            runs.append(first_run[:resumed] + mine[again:])
            replayed += again - resumed
        assert ids[:again] == [r["id"] for r in sent if (r["device"], r["metric"]) == key][:again]
        for run in runs:
            # Parameters only ever move to a newer version (an older one sent again is not
            # taken).
            versions = [r["model_version"] or 0 for r in run]
            assert versions == sorted(versions)
            # The key's readings numbered in scoring order from its first reading: a
            # reading scored again after the restart has its number of the first run.
            numbers = [(r["run"], r["seq"]) for r in run]
            assert numbers == [(run[0]["id"], n) for n in range(1, len(run) + 1)], numbers
            scorer = Scorer(MODELS["forecast"])
            for score in run:
                version = score["model_version"]
                chosen = given[key] if version == 1 else newer if version == 2 else None
                family = MODELS[chosen["model"]] if chosen else MODELS["forecast"]
                if scorer.model is not family:
                    scorer = Scorer.restore(family, scorer.state())
                using = json.loads(chosen["params"]) if chosen else None
                expected = scorer.score(values[score["id"]], using)
                assert abs(score["score"] - expected) < 1e-9, (score, expected)
                assert score["model"] == (chosen["model"] if chosen else None)
    print(f"{replayed} readings scored again after the restart")
    # Again at most what the first run had scored: from its last checkpoint on, no more.
    assert 0 <= replayed <= scored_before_restart
    assert len(records) == len(sent) + replayed
    # At least once: the restart wrote again the dead letters of what it read again.
    letters = topic_values(kafka, f"{job}.dlq")
    places = {(d["source_topic"], d["source_partition"], d["source_offset"]): d for d in letters}
    dead = list(places.values())
    assert sorted(d["error"] for d in dead) == [
        "not a CleanReading record",
        "not a ModelUpdate record",
        "params are not JSON text",
        "params are not JSON text",
        "params name no model family known here",
    ]
    for letter in dead:
        schema = "CleanReading" if letter["source_topic"] == clean else "ModelUpdate"
        assert (letter["schema"], letter["job"]) == (schema, job)
        if letter["error"] == "params are not JSON text":
            assert letter["source_topic"] == models
            held = json.loads(base64.b64decode(letter["value_base64"]))
            assert held["params"] == "{not json"


def test_a_family_the_jvm_scorer_does_not_know_is_refused_at_start(cli: RunCli) -> None:
    job = f"rt-{uuid.uuid4().hex[:8]}"
    start = ("jobs", "start", job, "--app", "kappaflow.iot.realtime:PIPELINE")
    refused = cli(*start, "-P", "model=hst")
    line = error_line(refused, "KF607", 1)
    assert "error[KF616]: model 'hst': the real-time scorer scores forecast and robust" in line


def test_raw_readings_are_checked_normalised_and_scored_once(cli: RunCli, kafka: Settings) -> None:
    job = f"rt-{uuid.uuid4().hex[:8]}"
    raw, models, scores = f"{job}-raw", f"{job}-models", f"{job}-scores"
    registry = f"{job}-registry"
    create_topic(kafka.kafka, raw, partitions=2)
    create_topic(kafka.kafka, models, partitions=1)
    register(kafka.kafka, {FORECAST[0]: "t1"}, topic=registry)
    topics: tuple[str, ...] = ("-P", f"source={raw}", "-P", f"models={models}")
    topics += ("-P", f"dest={scores}", "-P", f"registry={registry}")
    start = ("jobs", "start", job, "--app", "kappaflow.iot.realtime:PIPELINE", *topics)
    started = cli(*start, "-P", "readings=raw")
    assert started.code == 0, started.err
    history = noise(400, 3)
    model = _model(FORECAST, "forecast", 1, history[:300])
    send_json(kafka, models, [model], key="device")
    # Every other reading in Fahrenheit, as a device of the imperial firmware sends it.
    sent = readings(*FORECAST, history[300:], first=300)
    for i, r in enumerate(sent):
        if i % 2:
            r.update(value=r["value"] * 9 / 5 + 32, unit="fahrenheit")
    canonical = {r["id"]: round(v, 3) for r, v in zip(sent, history[300:], strict=True)}
    times = {r["id"]: r["time"] for r in sent}
    # A time in epoch milliseconds, as the cleaning job's parser takes it.
    sent[-1]["time"] = int(datetime.fromisoformat(sent[-1]["time"]).timestamp() * 1000)
    late = {**sent[0], "id": "far-future", "time": "2031-01-01T00:00:00+00:00"}
    refused: list[dict[str, Any] | bytes] = [
        {**sent[0], "id": "kelvin", "unit": "kelvin"},
        {**sent[0], "id": "too-hot", "value": 500.0},
        {**sent[0], "id": "voltage", "metric": "voltage"},
        {key: v for key, v in sent[0].items() if key != "time"} | {"id": "no-time"},
        {key: v for key, v in sent[0].items() if key != "seq"} | {"id": "no-seq"},
        {**sent[0], "id": "no-unit", "unit": None},
        {**sent[0], "id": 7},
        {**sent[0], "id": "no-zone", "time": "2026-11-20T05:00:00"},
        late,
        b"{not a reading",
        # A device the cleaning job does not know.
        {**sent[0], "device": "stranger", "id": "stranger/1/cpu_temp"},
    ]
    first = 0
    while first < 60:
        # Until the model is read (readings scored without one count too).
        send_json(kafka, raw, sent[first : first + 1], key="device")
        first += 1
        found = {s["id"]: s for s in topic_values(kafka, scores)}
        if found.get(sent[first - 1]["id"], {}).get("model_version") == 1:
            break
    # The rest, the refused ones, and some sent twice; the last reading comes after all
    # of them in the key's partition.
    rest = sent[first:-1]
    send_json(kafka, raw, [*rest[:10], *refused, *rest, *rest[:5], sent[-1]], key="device")
    wait_for(
        lambda: True if sent[-1]["id"] in {s["id"] for s in topic_values(kafka, scores)} else None,
        timeout=120,
        what="the last reading scored",
    )
    records = topic_values(kafka, scores)
    ids = [s["id"] for s in records]
    assert sorted(ids) == sorted(canonical), "each reading that cleaning passes, scored once"
    # A device whose readings come before its registration: they wait for it. A reading
    # of d1 after them in their partition, once scored, shows that they were read.
    early = readings("newcomer", "cpu_temp", history[:2], first=300)
    stranger = {**sent[0], "device": "stranger", "id": "stranger/2/cpu_temp"}
    marker = {**sent[1], "id": "d1/marker/cpu_temp"}
    producer = Producer(kafka.kafka.client_config())
    for value in (*early, stranger, marker):
        producer.produce(raw, key=value["device"].encode(), value=json.dumps(value), partition=0)
    assert producer.flush(30) == 0

    def scored(*wanted: str) -> bool | None:
        return True if set(wanted) <= {s["id"] for s in topic_values(kafka, scores)} else None

    wait_for(lambda: scored(marker["id"]), timeout=60, what="the marker scored")
    unregistered = {*[r["id"] for r in early], stranger["id"]}
    assert not unregistered & {s["id"] for s in topic_values(kafka, scores)}
    register(kafka.kafka, {"newcomer": "t3"}, topic=registry)
    wait_for(lambda: scored(*[r["id"] for r in early]), timeout=60, what="the early readings")
    assert stranger["id"] not in {s["id"] for s in topic_values(kafka, scores)}
    assert cli("jobs", "stop", job).code == 0
    scorer = Scorer(MODELS["forecast"])
    params = json.loads(model["params"])
    for s in records:
        assert s["value"] == canonical[s["id"]]
        assert s["time"].endswith("Z") and s["time"][:16] == times[s["id"]][:16]
        expected = scorer.score(s["value"], params if s["model_version"] == 1 else None)
        assert abs(s["score"] - expected) < 1e-9, (s, expected)
    # Removed, the job takes its own topic with it, and leaves the topics it was given.
    assert f"{job}.dlq" in {t["name"] for t in list_topics(kafka.kafka)}
    assert cli("jobs", "remove", job).code == 0
    left = {t["name"] for t in list_topics(kafka.kafka)}
    assert f"{job}.dlq" not in left and {raw, models, scores} <= left


def test_a_removed_device_is_passed_over_once_the_scorer_has_read_its_removal(
    cli: RunCli, kafka: Settings
) -> None:
    """The registry and the readings are read side by side, so a tombstone reaches the
    scorer at no fixed point among the readings; once it has, the device's readings are
    passed over. One partition of readings, so one state partition: a reading of the
    device, then a marker of d1 after it, reach the state in that order, and the marker's
    score shows that the device's reading was judged."""
    job = f"rt-{uuid.uuid4().hex[:8]}"
    raw, models, scores = f"{job}-raw", f"{job}-models", f"{job}-scores"
    registry = f"{job}-registry"
    create_topic(kafka.kafka, raw, partitions=1)
    create_topic(kafka.kafka, models, partitions=1)
    register(kafka.kafka, {FORECAST[0]: "t1", "gone": "t2"}, topic=registry)
    topics: tuple[str, ...] = ("-P", f"source={raw}", "-P", f"models={models}")
    topics += ("-P", f"dest={scores}", "-P", f"registry={registry}", "-P", "readings=raw")
    started = cli("jobs", "start", job, "--app", "kappaflow.iot.realtime:PIPELINE", *topics)
    assert started.code == 0, started.err
    values = itertools.cycle(noise(400, 6))
    count = {"gone": 0, FORECAST[0]: 0}

    def reading(device: str) -> dict[str, Any]:
        [one] = readings(device, FORECAST[1], [next(values)], first=count[device])
        count[device] += 1
        return one

    def scored() -> set[str]:
        return {s["id"] for s in topic_values(kafka, scores)}

    def send_then_mark(*sent: dict[str, Any]) -> None:
        """``sent``, then a reading of d1, which is waited for."""
        marker = reading(FORECAST[0])
        send_json(kafka, raw, [*sent, marker], key="device")
        wait_for(lambda: marker["id"] in scored() or None, timeout=120, what=f"{marker['id']}")

    try:
        registered = reading("gone")
        send_then_mark(registered)
        wait_for(lambda: registered["id"] in scored() or None, timeout=120, what="gone scored")
        removal = Producer(kafka.kafka.client_config())
        removal.produce(registry, key=b"gone", value=None)
        assert removal.flush(30) == 0
        # Until the scorer has read the removal, the device's readings are scored; the
        # first one passed over shows that it has. Judged one marker later.
        probes: list[dict[str, Any]] = []

        def removal_read() -> bool | None:
            probes.append(reading("gone"))
            send_then_mark(probes[-1])
            earlier = probes[:-1]
            return True if earlier and earlier[-1]["id"] not in scored() else None

        wait_for(removal_read, timeout=240, what="the scorer to read the removal")
        first_passed = probes[-2]
        after = [reading("gone") for _ in range(5)]
        send_then_mark(*after)
        send_then_mark()
        found = scored()
    finally:
        assert cli("jobs", "stop", job).code == 0
    gone = [r["id"] for r in [registered, *probes, *after]]
    passed = gone.index(first_passed["id"])
    # Scored up to the removal, in order; from then on, none.
    assert [i for i in gone if i in found] == gone[:passed], (gone, found)
    assert passed >= 1
