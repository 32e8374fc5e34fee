"""``jobs promote``: the shadow's version takes over the live job's outputs, exactly once.

A window's record in an output's topic is ``provisional`` while the window is open,
``final`` once the watermark passed its end, ``correction`` for a late event after that.
Consumers read each window's final values off the topic; "no window lost or written
twice" means each (window, key) gets one ``final`` from one version or the other, and
each correction once. The promote:

1. stops the live job (its batch under way finishes; its checkpoint and sinks agree),
   unless the shadow is stopped behind it, which is refused with nothing touched;
2. waits for the shadow's last committed batch, per output, to have read at least as far
   as the live job's in every source partition, under a watermark at least the live
   job's: every window the live job made final, the shadow has made final too (a key the
   new version drops aside). Then a savepoint of the live job, ``promote-<time>``, keeps
   the version to go back to, and the shadow is stopped;
3. bridges each output's topic: publishes to the live topic, in one transaction, the
   shadow's ``final`` and ``correction`` records of the windows the live job never made
   final, and the shadow's corrections from its batches that read past the live job's
   position (events the live job never saw). Windows the live job made final keep their
   one ``final``; the shadow's own finals of them stay in its topic;
4. moves the shadow's progress under the live name: the commit markers (``NAME.commits``
   made anew with the shadow's), the serving store (the shadow's window values over the
   live job's, its statistics and open windows instead of the live job's), the lake
   tables (the shadow's in place of the live job's, which the savepoint keeps), and the
   checkpoint (the shadow's, named for its new place);
5. starts the live job with the new version, which goes on from the shadow's checkpoint:
   its next batches are the shadow's next, so a window still open is made final once, by
   it; then drops the shadow.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kappaflow.errors import (
    NoShadowError,
    ProduceError,
    ShadowBehindError,
    TopicNotFoundError,
    WaitTimeoutError,
)
from kappaflow.jobs.diff import FINAL_KINDS, window_id, windowed_outputs
from kappaflow.jobs.manager import JobManager, JobState
from kappaflow.jobs.shadows import SHADOW, shadow_info
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

#: How long a promote waits for the shadow to reach the live job's position.
CATCH_UP_TIMEOUT_S = 300.0

#: A position: per source topic, per partition, the offset read up to.
Ends = dict[str, dict[str, int]]


def _batches(folder: Path) -> list[int]:
    log = folder / "commits"
    return sorted(int(p.name) for p in log.iterdir() if p.name.isdigit()) if log.is_dir() else []


def _offsets(folder: Path, batch: int) -> tuple[int, Ends]:
    """Batch ``batch``'s watermark and end offsets (the offset log: a version line, the
    batch's metadata, then one line per source)."""
    lines = (folder / "offsets" / str(batch)).read_text().splitlines()
    watermark = int(json.loads(lines[1]).get("batchWatermarkMs", 0))
    ends: Ends = {}
    for line in lines[2:]:
        if line.startswith("{"):
            for topic, partitions in json.loads(line).items():
                if isinstance(partitions, dict):
                    ends[topic] = {str(p): int(o) for p, o in partitions.items()}
    return watermark, ends


def _covers(ahead: Ends, behind: Ends) -> bool:
    """Whether ``ahead`` has read each partition ``behind`` read at least as far."""
    return all(
        int(ahead.get(topic, {}).get(p, -1)) >= offset
        for topic, partitions in behind.items()
        for p, offset in partitions.items()
    )


def positions(root: Path) -> dict[str, tuple[int, int, Ends]]:
    """Each query's last committed batch, its watermark and end offsets."""
    found = {}
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        batches = _batches(folder)
        if batches and (folder / "offsets").is_dir():
            found[folder.name] = (batches[-1], *_offsets(folder, batches[-1]))
    return found


def _last_within(folder: Path, live: Ends) -> int:
    """The shadow's last committed batch that read nothing past the live job's ends."""
    within = -1
    for batch in _batches(folder):
        if _covers(live, _offsets(folder, batch)[1]):
            within = batch
    return within


def promote(
    settings: Settings, name: str, *, timeout: float = CATCH_UP_TIMEOUT_S
) -> dict[str, Any]:
    """Promote job ``name``'s shadow (see the module); what was done."""
    from kappaflow.jobs.removal import remove_job
    from kappaflow.jobs.savepoints import checkpoint_path, take

    info = shadow_info(settings, name)
    jobs = JobManager(settings)
    shadow = str(info["job"])
    live = jobs.get(name)
    if jobs.get_state(shadow) is JobState.ABSENT:
        raise NoShadowError(f"job {name!r}'s shadow {shadow!r} never started")
    live_root, shadow_root = checkpoint_path(settings, name), checkpoint_path(settings, shadow)

    def caught_up(held: Mapping[str, tuple[int, int, Ends]]) -> bool | None:
        now = positions(shadow_root)
        for query, (_batch, watermark, ends) in held.items():
            if query not in now:
                continue  # an output the new version does not have
            _b, at, reached = now[query]
            if at < watermark or not _covers(reached, ends):
                return None
        return True

    # A stopped shadow catches up with nothing: refused before the live job is touched.
    if not jobs.is_running(shadow) and (
        jobs.is_running(name) or not caught_up(positions(live_root))
    ):
        raise ShadowBehindError(
            f"job {name!r}'s shadow {shadow!r} is stopped behind the live job: start it "
            f"again (`kappaflow jobs start {shadow} --app {info['app']} -P "
            f"kf.shadow_of={name}` with its other -P) and promote once it caught up"
        )
    if jobs.is_running(name):
        jobs.stop(name)
    held = positions(live_root)
    try:
        wait_for(
            lambda: caught_up(held), timeout=timeout, interval=0.5, what=f"{shadow} to catch up"
        )
    except WaitTimeoutError:
        jobs.start(
            name,
            live.pipeline,
            live.params,
            overrides=live.overrides,
            config_file=Path(live.config_file) if live.config_file else None,
        )
        raise ShadowBehindError(
            f"job {name!r}'s shadow {shadow!r} did not reach the live job's position within "
            f"{timeout:.0f}s: the live job runs again; promote once the shadow caught up"
        ) from None
    # The live job's checkpoint as it stopped, with its sinks: the version to go back to.
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    saved = take(settings, name, f"promote-{stamp}")
    if jobs.is_running(shadow):
        jobs.stop(shadow)
    bridged = _bridge(settings, name, shadow, held, shadow_root)
    _take_over(settings, name, shadow, live_root, shadow_root)
    params = {str(k): str(v) for k, v in info["params"].items()}
    jobs.start(
        name,
        str(info["app"]),
        params,
        overrides=live.overrides,
        config_file=Path(live.config_file) if live.config_file else None,
    )
    remove_job(settings, shadow)
    (jobs.job_dir(name) / SHADOW).unlink(missing_ok=True)
    return {"job": name, "app": info["app"], "savepoint": saved.label, "bridged": bridged}


def _bridge(
    settings: Settings,
    name: str,
    shadow: str,
    held: Mapping[str, tuple[int, int, Ends]],
    shadow_root: Path,
) -> dict[str, int]:
    """Publish to each live topic the shadow's records the live job's consumers would
    otherwise miss (step 3); how many, per output."""
    from confluent_kafka import KafkaException

    from kappaflow.kafka.clients import transactional_producer
    from kappaflow.kafka.records import StartAt, read_records

    jobs = JobManager(settings)
    live_outputs, shadow_outputs = (
        windowed_outputs(jobs.plan(name)),
        windowed_outputs(jobs.plan(shadow)),
    )
    bridged: dict[str, int] = {}
    for output in sorted(live_outputs.keys() & shadow_outputs.keys()):
        old, new = live_outputs[output], shadow_outputs[output]
        finals = set()
        try:
            for message in read_records(
                settings.kafka, old["topic"], start=StartAt(beginning=True)
            ):
                record = json.loads(message.value() or b"{}")
                if record.get("kind") in FINAL_KINDS:
                    finals.add(window_id(record, old["by"]))
            found = list(read_records(settings.kafka, new["topic"], start=StartAt(beginning=True)))
        except TopicNotFoundError:
            continue
        ends = held[output][2] if output in held else {}
        within = _last_within(shadow_root / output, ends)
        picked = []
        for message in found:
            record = json.loads(message.value() or b"{}")
            if record.get("kind") not in FINAL_KINDS:
                continue
            if window_id(record, new["by"]) not in finals or (
                record["kind"] == "correction" and int(record.get("batch") or 0) > within
            ):
                picked.append(message)
        bridged[output] = len(picked)
        if not picked:
            continue
        producer = transactional_producer(settings.kafka, f"kappaflow-promote-{name}-{output}")
        try:
            producer.begin_transaction()
            for message in picked:
                producer.produce(old["topic"], value=message.value(), key=message.key())
            producer.commit_transaction(120)
        except KafkaException as exc:
            raise ProduceError(f"bridging {output} to {old['topic']!r} failed: {exc}") from None
    return bridged


def _take_over(
    settings: Settings, name: str, shadow: str, live_root: Path, shadow_root: Path
) -> None:
    """The shadow's markers, store keys, lake tables and checkpoint under the live name
    (step 4)."""
    from kappaflow.jobs.files import local_path, read_resources
    from kappaflow.jobs.restore import relocate, restore_markers
    from kappaflow.jobs.savepoints import read_markers

    jobs = JobManager(settings)
    restore_markers(settings, name, read_markers(settings, shadow))
    if read_resources(jobs.job_dir(shadow)).redis:
        _merge_store(settings, name, shadow)
    live_plan = {o["name"]: o for o in jobs.plan(name)["outputs"]}
    for output in jobs.plan(shadow)["outputs"]:
        for sink in output["sinks"]:
            if "location" not in sink or output["name"] not in live_plan:
                continue
            target = next(
                (
                    s["location"]
                    for s in live_plan[output["name"]]["sinks"]
                    if s.get("parquet") == sink["parquet"] and "location" in s
                ),
                None,
            )
            source_path = local_path(sink["location"])
            target_path = local_path(target) if target is not None else None
            if source_path is None or target_path is None or not source_path.exists():
                continue
            shutil.rmtree(target_path, ignore_errors=True)
            shutil.copytree(source_path, target_path)
    incoming = live_root.parent / f".{name}.promoting"
    shutil.rmtree(incoming, ignore_errors=True)
    shutil.copytree(shadow_root, incoming)
    relocate(incoming, str(shadow_root.absolute()), str(live_root.absolute()))
    shutil.rmtree(live_root, ignore_errors=True)
    incoming.rename(live_root)
    for folder in ("outputs",):
        shutil.rmtree(jobs.job_dir(name) / folder, ignore_errors=True)
        if (jobs.job_dir(shadow) / folder).is_dir():
            shutil.copytree(jobs.job_dir(shadow) / folder, jobs.job_dir(name) / folder)


def _merge_store(settings: Settings, name: str, shadow: str) -> None:
    """The shadow's serving-store keys under the live name: a key's windows (a hash per
    key), a keyed stream's latest records and the keys' sets merged over the live job's,
    the rest (statistics, open windows) in place of it."""
    from kappaflow.serving.client import redis_client

    client = redis_client(settings)
    prefix, into = f"kf:{shadow}:".encode(), f"kf:{name}:".encode()
    for key in list(client.scan_iter(match=f"kf:{shadow}:*", count=1000)):
        target = into + key[len(prefix) :]
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        if kind == "hash" and (b":w:" in key or key.endswith(b":latest")):
            fields: dict[Any, Any] = dict(client.hgetall(key))
            if fields:
                client.hset(target, mapping=fields)
        elif kind == "set":
            members = client.smembers(key)
            if members:
                client.sadd(target, *members)
        else:
            dumped = client.dump(key)
            if dumped is not None:
                client.restore(target, 0, dumped, replace=True)
