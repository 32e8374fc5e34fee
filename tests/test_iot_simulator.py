"""The IoT device simulator: what its fleet sends, the faults and the labelled anomalies,
checked against the records themselves."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from conftest import RunCli
from live_jobs import topic_values

from kappaflow.iot.simulator import FleetConfig, Label, Simulation, Tally
from kappaflow.iot.telemetry import (
    EVENTS_TOPIC,
    METRIC_NAMES,
    METRICS,
    READINGS_TOPIC,
    to_canonical,
    to_reported,
)
from kappaflow.settings import Settings

START = datetime(2026, 11, 20, tzinfo=UTC).timestamp()
#: A small fleet without faults or anomalies unless a test asks for them.
QUIET = FleetConfig(
    devices=20,
    rate=20.0,
    anomalies_per_day=0.0,
    skewed_share=0.0,
    late_share=0.0,
    duplicate_share=0.0,
    silences_per_day=0.0,
)


def simulate(
    config: FleetConfig, hours: float
) -> tuple[list[tuple[str, dict[str, Any]]], list[Label], Tally]:
    simulation = Simulation(config, START)
    sent: list[tuple[str, dict[str, Any]]] = []
    labels: list[Label] = []
    for records, incidents in simulation.run(START + hours * 3600, step_s=10.0):
        sent += [(r.topic, json.loads(r.value)) for r in records]
        labels += incidents
    return sent, labels, simulation.tally


def readings(sent: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [value for topic, value in sent if topic == READINGS_TOPIC]


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_the_same_seed_sends_the_same_records_and_labels() -> None:
    config = replace(FleetConfig(devices=20, rate=40.0), anomalies_per_day=100.0)
    first, second = simulate(config, 0.25), simulate(config, 0.25)
    assert first[0] == second[0] and first[1] == second[1]
    assert first[1], "no anomaly began: the comparison would not cover labels"
    other = simulate(replace(config, seed=2), 0.25)
    assert other[0] != first[0]


def test_a_quiet_fleet_sends_every_metric_of_every_round_at_the_rate() -> None:
    sent, labels, tally = simulate(QUIET, 1.0)
    values = readings(sent)
    assert labels == []
    # 20 readings a second for an hour, give or take the rounds under way at the end.
    assert abs(len(values) - 20 * 3600) <= QUIET.devices * len(METRICS)
    assert tally.readings == len(values) and tally.duplicates == 0
    rounds = Counter((v["device"], v["seq"]) for v in values)
    assert set(rounds.values()) == {len(METRICS)}
    # A device's rounds are interval_s apart: 6 s here.
    times = sorted(epoch(v["time"]) for v in values if v["device"] == "dev-000003")
    gaps = {round(b - a, 3) for a, b in itertools.pairwise(times) if b != a}
    assert gaps == {QUIET.interval_s}
    beats = [v for topic, v in sent if topic == EVENTS_TOPIC and v["kind"] == "heartbeat"]
    assert abs(len(beats) - QUIET.devices * 3600 / QUIET.heartbeat_s) <= QUIET.devices


def test_values_stay_in_range_and_follow_the_units_of_each_firmware() -> None:
    sent, _, _ = simulate(replace(QUIET, imperial_share=0.5), 0.5)
    units: dict[str, set[str]] = defaultdict(set)
    for value in readings(sent):
        metric = METRICS[METRIC_NAMES.index(value["metric"])]
        assert value["unit"] in {metric.unit, metric.imperial_unit}
        canonical = to_canonical(value["unit"], value["value"])
        assert metric.low - 0.01 <= canonical <= metric.high + 0.01
        units[value["device"]].add(value["unit"])
    assert any("fahrenheit" in u for u in units.values())
    assert any("celsius" in u for u in units.values())
    assert to_canonical("fahrenheit", to_reported("fahrenheit", 21.5)) == pytest.approx(21.5)
    assert to_canonical("ratio", 0.42) == pytest.approx(42.0)


def test_each_labelled_anomaly_is_in_the_readings() -> None:
    config = replace(QUIET, devices=10, rate=10.0, anomalies_per_day=40.0, skewed_share=0.5)
    sent, labels, tally = simulate(config, 3.0)
    # The same fleet without anomalies: the same seed sends the same readings, so a
    # reading's deviation is what the anomaly added.
    calm, no_labels, _ = simulate(replace(config, anomalies_per_day=0.0), 3.0)
    assert no_labels == []
    metric_of = {m.name: m for m in METRICS}

    def series(
        found: list[tuple[str, dict[str, Any]]],
    ) -> dict[tuple[str, str], dict[int, tuple[float, float]]]:
        """(device, metric) → seq → (time, value in the canonical unit)."""
        out: dict[tuple[str, str], dict[int, tuple[float, float]]] = defaultdict(dict)
        for v in readings(found):
            canonical = to_canonical(v["unit"], v["value"])
            out[(v["device"], v["metric"])][v["seq"]] = (epoch(v["time"]), canonical)
        return out

    anomalous, normal = series(sent), series(calm)
    kinds = Counter(label.kind for label in labels)
    assert set(kinds) == {"spike", "level_shift", "drift", "stuck", "variance", "dropout"}
    assert tally.anomalies == len(labels)
    windows: dict[tuple[str, str], list[Label]] = defaultdict(list)
    measured: Counter[str] = Counter()
    for label in labels:
        assert label.metric is not None and label.cls == "anomaly"
        cell = (label.device, label.metric)
        windows[cell].append(label)
        metric = metric_of[label.metric]
        during = sorted(
            (seq, value)
            for seq, (t, value) in anomalous[cell].items()
            if label.start <= t < label.end
        )
        values = [value for _, value in during]
        # What the anomaly added to each reading it touched; a reading clipped at its
        # sensor's range is left out (its deviation is cut there). Values are rounded
        # to 3 decimals as reported (a ratio: 0.05 percentage points).
        tolerance = 0.06
        added = [
            value - normal[cell][seq][1]
            for seq, value in during
            if metric.low + tolerance < value < metric.high - tolerance
        ]
        if label.kind == "dropout":
            assert during == [], f"a dropout sent readings: {label}"
            assert any(label.start <= t < label.end for t, _ in normal[cell].values())
        elif label.kind == "stuck":
            assert len(set(values)) <= 1, f"a stuck sensor moved: {label}"
        elif label.kind == "spike":
            assert 1 <= len(during) <= 3, label
            # Four to eight of the metric's scales, at least 16 of its noise deviations.
            measured[label.kind] += bool(added)
            for deviation in added:
                assert 4 * metric.scale - tolerance <= abs(deviation), (label, added)
                assert abs(deviation) <= 8 * metric.scale + tolerance, (label, added)
        elif len(added) < 5:
            # Cut at the sensor's range (a utilisation near 0 shifted down, say).
            assert len(during) - len(added) > len(added), (label, values)
        elif label.kind == "level_shift":
            # One step, held: the same amount, 2.5 to 5 scales, on every reading.
            measured[label.kind] += 1
            assert max(added) - min(added) <= 2 * tolerance, (label, added)
            assert 2.5 * metric.scale - tolerance <= abs(added[0]), (label, added)
            assert abs(added[0]) <= 5 * metric.scale + tolerance, (label, added)
        elif label.kind == "drift":
            # Away from the level, one way, further each reading.
            assert all(d >= -tolerance for d in added) or all(d <= tolerance for d in added)
            away = [abs(d) for d in added]
            assert all(b >= a - tolerance for a, b in itertools.pairwise(away)), (label, away)
            # Linearly: in proportion to the share of the drift's time gone by, towards
            # 3 to 6 scales at its end (which a run may not reach).
            span = label.end - label.start
            sizes = [
                abs(value - normal[cell][seq][1]) * span / (t - label.start)
                for seq, (t, value) in anomalous[cell].items()
                if label.start + span / 10 <= t < label.end
                and metric.low + tolerance < value < metric.high - tolerance
            ]
            if sizes:
                measured[label.kind] += 1
                assert max(sizes) - min(sizes) <= 0.1 * metric.scale, (label, sizes)
                assert 3 * metric.scale * 0.98 <= sizes[0] <= 6 * metric.scale * 1.02, label
        elif label.kind == "variance":
            measured[label.kind] += 1
            quiet = [normal[cell][seq][1] for seq, _ in during]
            assert float(np.std(values)) > 2 * float(np.std(quiet)), label
    # Each kind measured on several anomalies that the range did not cut.
    assert all(measured[kind] >= 3 for kind in ("spike", "level_shift", "drift", "variance"))
    # Outside every window, the readings are those of the fleet without anomalies.
    for cell, cells_labels in windows.items():
        for seq, (t, value) in anomalous[cell].items():
            if not any(label.start <= t < label.end for label in cells_labels):
                assert value == normal[cell][seq][1], (cell, seq)
    assert anomalous.keys() == normal.keys()


def test_devices_skew_their_clocks_send_late_and_twice_and_go_silent() -> None:
    config = replace(
        QUIET,
        devices=10,
        rate=10.0,
        skewed_share=0.5,
        late_share=0.05,
        duplicate_share=0.02,
        silences_per_day=12.0,
    )
    sent, labels, tally = simulate(config, 2.0)
    values = readings(sent)
    # Duplicates: the same reading, id and all, sent again.
    ids = Counter(json.dumps(v, sort_keys=True) for v in values)
    assert sum(n - 1 for n in ids.values()) == tally.duplicates > 0
    # Out of order: a device's readings arrive with times going backwards.
    newest: dict[str, float] = {}
    backwards = 0
    for value in values:
        at = epoch(value["time"])
        backwards += at < newest.get(value["device"], at)
        newest[value["device"]] = max(at, newest.get(value["device"], at))
    assert backwards > 0 and tally.delayed > 0
    # Clock skew: sends are in the fleet's time order, yet their stamps jump by more than
    # any hold-back: some devices' clocks are off.
    stamps = [epoch(v["time"]) for v in values]
    jumps = [abs(b - a) for a, b in itertools.pairwise(stamps)]
    assert max(jumps) > config.max_delay_s + config.interval_s
    silences = [label for label in labels if label.kind == "silent"]
    assert silences and all(s.cls == "fault" and s.metric is None for s in silences)
    for silence in silences:
        quiet = [
            v
            for _, v in sent
            if v["device"] == silence.device and silence.start <= epoch(v["time"]) < silence.end
        ]
        assert quiet == [], f"a silent device sent: {silence}"


def test_simulate_backfills_json_lines_and_labels(cli: RunCli, tmp_path: Any) -> None:
    labels = tmp_path / "labels.jsonl"
    result = cli(
        "iot", "simulate", "--devices", "10", "--rate", "10", "--start",
        "2026-11-20T00:00:00Z", "--duration", "30m", "--anomalies-per-day", "100",
        "--labels", str(labels), "--output", "stdout",
    )  # fmt: skip
    assert result.code == 0, result.err
    lines = [json.loads(line) for line in result.out.splitlines()]
    topics = Counter(line["topic"] for line in lines)
    summary = json.loads(result.err)
    assert topics[READINGS_TOPIC] == summary["readings"] + summary["duplicates"] > 15_000
    assert topics[EVENTS_TOPIC] == summary["heartbeats"] + summary["events"] > 0
    assert all(line["key"] == line["value"]["device"] for line in lines)
    written = [json.loads(line) for line in labels.read_text().splitlines()]
    assert written and {"device", "metric", "class", "kind", "start", "end"} == set(written[0])


def test_simulate_refuses_a_backfill_without_an_end(cli: RunCli) -> None:
    result = cli("iot", "simulate", "--start", "2026-11-20T00:00:00Z", "--output", "stdout")
    assert result.code == 2
    assert result.err.strip() == (
        "kappaflow: error[KF001]: --start backfills a span of time: give --duration too"
    )


def test_simulate_sends_to_the_broker(cli: RunCli, kafka: Settings, tmp_path: Any) -> None:
    readings_topic, events_topic = f"raw-{tmp_path.name}", f"events-{tmp_path.name}"
    result = cli(
        "iot", "simulate", "--devices", "5", "--rate", "10", "--start",
        "2026-11-20T00:00:00Z", "--duration", "5m", "--readings-topic", readings_topic,
        "--events-topic", events_topic, "--labels", str(tmp_path / "labels.jsonl"),
    )  # fmt: skip
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    values = topic_values(kafka, readings_topic)
    assert len(values) == summary["readings"] + summary["duplicates"]
    # 5 devices' 6 metrics every 3 s for 5 minutes, less what silences (a device quiet for
    # 5 to 30 minutes) and dropouts took.
    assert summary["readings"] <= 3_000
    assert summary["readings"] > 2_700 or summary["silences"] > 0, summary
    assert summary["readings"] > 1_000, summary
    events = topic_values(kafka, events_topic)
    assert len(events) == summary["heartbeats"] + summary["events"] > 0
