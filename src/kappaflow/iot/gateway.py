"""The HTTP gateway: devices POST readings and events; each is in Kafka before the answer.

``POST /v1/devices/{device}/readings`` takes one reading (a JSON object) or a batch (an
array); ``POST /v1/devices/{device}/events`` the same for device events. The device
authenticates with ``Authorization: Bearer <token>``, its token in the device registry
(``kappaflow.iot.registry``). Each item is checked against the reading's (or event's)
schema; good items go to ``telemetry.raw`` (``devices.events``) keyed by the device, and
items that fail, with bodies that are not JSON and requests of unknown devices or wrong
tokens, go to the gateway's dead-letter topic with the reason and the original bytes.

The answer comes only after Kafka has acknowledged every record of the request (the
producer waits for all in-sync replicas, and is idempotent, so its retries neither
duplicate nor reorder): a 200 means the request's records are in the log, dead letters
included. When Kafka does not acknowledge within ``delivery_timeout_s``, or is known to be
down, the answer is 503 and the device sends again; when more than ``max_in_flight``
records wait for Kafka, it is 429, and the gateway's memory stays bounded. Every error is
JSON: ``{"code": "KF8xx", "error": "..."}`` with the status of its kind.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kappaflow.errors import (
    GatewayBadRequestError,
    GatewayError,
    GatewayOverloadError,
    GatewayUnauthorizedError,
    GatewayUnavailableError,
    UnknownDeviceError,
)
from kappaflow.iot.registry import Registry
from kappaflow.iot.telemetry import EVENTS_TOPIC, GATEWAY_DLQ_TOPIC, READINGS_TOPIC
from kappaflow.kafka.clients import producer
from kappaflow.kafka.topics import DEFAULT_PARTITIONS, create_topic
from kappaflow.settings import KafkaSettings
from kappaflow.timeutil import iso

DLQ_TOPIC = GATEWAY_DLQ_TOPIC
#: Largest request body read: a batch of a few thousand readings.
MAX_BODY_BYTES = 1 << 20
#: Largest batch: one request must not take the whole in-flight budget.
MAX_BATCH = 5_000
#: Epoch milliseconds a device's clock may plausibly show (2001 to 2286): a number
#: outside is seconds or garbage. How far from now is the cleaning job's to judge.
EPOCH_MS_LOW, EPOCH_MS_HIGH = 10**12, 10**13 - 1


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class _Item(BaseModel):
    model_config = ConfigDict(extra="allow")

    device: str | None = None
    #: The device's clock: ISO-8601 with a zone, or epoch milliseconds.
    time: str | int

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, value: Any) -> str | int:
        if isinstance(value, bool):
            raise ValueError("must be ISO-8601 with a zone or epoch milliseconds")
        if isinstance(value, int):
            if not EPOCH_MS_LOW <= value <= EPOCH_MS_HIGH:
                raise ValueError("epoch milliseconds out of range (seconds, not milliseconds?)")
            return value
        if isinstance(value, str):
            try:
                parsed = datetime.fromisoformat(value)
            except ValueError:
                raise ValueError("is not ISO-8601") from None
            if parsed.tzinfo is None:
                raise ValueError("has no time zone: end it with Z or an offset")
            return value
        raise ValueError("must be ISO-8601 with a zone or epoch milliseconds")


class ReadingIn(_Item):
    """A reading as a device sends it (the cleaning job checks metric, unit and range)."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(min_length=1, max_length=64)
    value: float
    unit: str = Field(min_length=1, max_length=32)
    seq: int = Field(ge=0)
    id: str = Field(min_length=1, max_length=200)

    _value = field_validator("value")(_finite)


class EventIn(_Item):
    """A device event; fields beyond these are the event's own and pass as they are."""

    kind: Literal["heartbeat", "command", "state"]


@dataclass(frozen=True)
class GatewayConfig:
    readings_topic: str = READINGS_TOPIC
    events_topic: str = EVENTS_TOPIC
    dlq_topic: str = DLQ_TOPIC
    #: Records waiting for Kafka's acknowledgement, beyond which requests get 429.
    max_in_flight: int = 20_000
    #: How long a record may wait for Kafka's acknowledgement before the answer is 503.
    delivery_timeout_s: float = 10.0
    partitions: int = DEFAULT_PARTITIONS


class Delivery:
    """The Kafka side: an idempotent producer (acks=all), polled by a thread of its own,
    whose acknowledgements resolve the requests' futures on the event loop."""

    def __init__(self, kafka: KafkaSettings, config: GatewayConfig) -> None:
        self.config = config
        timeout_ms = int(config.delivery_timeout_s * 1000)
        self.client: Producer = producer(
            kafka,
            acks="all",
            **{
                "delivery.timeout.ms": timeout_ms,
                "request.timeout.ms": min(timeout_ms, 5_000),
                "queue.buffering.max.messages": config.max_in_flight * 2,
                "error_cb": self._on_error,
            },
        )
        self.in_flight = 0
        #: Since when (monotonic) every broker has been unreachable; None while one is up.
        self.down_since: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="gateway-producer", daemon=True)
        self._poller.start()

    def _on_error(self, err: KafkaError) -> None:
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            with self._lock:
                if self.down_since is None:
                    self.down_since = time.monotonic()

    def _poll(self) -> None:
        probed = 0.0
        while not self._stop.is_set():
            self.client.poll(0.05)
            # Known down, requests are refused at once, so no delivery reports the return:
            # a metadata request each second does.
            if self.down_since is not None and time.monotonic() - probed >= 1.0:
                probed = time.monotonic()
                with contextlib.suppress(KafkaException):
                    if self.client.list_topics(timeout=1.0).brokers:
                        with self._lock:
                            self.down_since = None

    def unavailable(self) -> bool:
        """Whether every broker is known unreachable: then requests are refused at once
        rather than held for the delivery timeout."""
        return self.down_since is not None

    async def send(self, records: list[tuple[str, bytes, bytes]]) -> None:
        """Produce ``records`` (topic, key, value) and wait until Kafka acknowledges all of
        them; GatewayUnavailableError if any is not, GatewayOverloadError when too many
        records already wait."""
        if self.unavailable():
            raise GatewayUnavailableError("Kafka is unavailable: send again later")
        with self._lock:
            if self.in_flight + len(records) > self.config.max_in_flight:
                raise GatewayOverloadError(
                    f"{self.in_flight} records are waiting for Kafka: send again later"
                )
            self.in_flight += len(records)
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = []
        produced = 0
        try:
            for topic, key, value in records:
                future: asyncio.Future[None] = loop.create_future()
                self.client.produce(topic, value, key, on_delivery=self._resolver(loop, future))
                futures.append(future)
                produced += 1
        except BufferError:
            # librdkafka's own queue is full: as overloaded as the in-flight limit says.
            self._done(len(records) - produced)
            await asyncio.gather(*futures, return_exceptions=True)
            raise GatewayOverloadError("the producer's queue is full: send again later") from None
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise GatewayUnavailableError(
                f"Kafka did not acknowledge {len(failed)} of {len(records)} records "
                f"({failed[0]}): send again later"
            )

    def _resolver(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> Any:
        def delivered(err: KafkaError | None, _msg: Message) -> None:
            self._done(1)
            if err is None:
                with self._lock:
                    self.down_since = None
                loop.call_soon_threadsafe(_settle, future, None)
            else:
                loop.call_soon_threadsafe(_settle, future, RuntimeError(err.str()))

        return delivered

    def _done(self, n: int) -> None:
        with self._lock:
            self.in_flight -= n

    def close(self) -> None:
        self.client.flush(self.config.delivery_timeout_s)
        self._stop.set()
        self._poller.join(timeout=5)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _dead_letter(
    reason: str, device: str, path: str, raw: bytes, index: int | None = None
) -> bytes:
    body = {
        "error": reason,
        "source": "gateway",
        "path": path,
        "device": device,
        "index": index,
        "received": iso(datetime.now(UTC)),
        "value_base64": base64.b64encode(raw).decode() if raw else None,
    }
    return json.dumps(body).encode()


def _problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "the item"
    return f"{where}: {first['msg'].removeprefix('Value error, ')}"


class Gateway:
    """The gateway's state: the registry, the producer and what it has counted."""

    def __init__(self, kafka: KafkaSettings, registry: Registry, config: GatewayConfig) -> None:
        self.kafka = kafka
        self.registry = registry
        self.config = config
        self.counts: Counter[str] = Counter()
        self.delivery: Delivery | None = None

    def start(self) -> None:
        for topic in (self.config.readings_topic, self.config.events_topic):
            create_topic(self.kafka, topic, partitions=self.config.partitions, exist_ok=True)
        create_topic(self.kafka, self.config.dlq_topic, partitions=1, exist_ok=True)
        self.registry.start()
        self.delivery = Delivery(self.kafka, self.config)

    def stop(self) -> None:
        if self.delivery is not None:
            self.delivery.close()
        self.registry.stop()

    async def accept(
        self,
        device: str,
        token: str | None,
        body: bytes,
        schema: type[_Item],
        topic: str,
        path: str,
    ) -> dict[str, Any]:
        assert self.delivery is not None, "the gateway is not started"
        dlq = self.config.dlq_topic
        known = self.registry.check(device, token)
        if known is not True:
            failure: GatewayError = (
                UnknownDeviceError(f"device {device!r} is not registered")
                if known is None
                else GatewayUnauthorizedError(f"no valid token for device {device!r}")
            )
            reason = "unknown device" if known is None else "missing or wrong token"
            await self.delivery.send(
                [(dlq, device.encode(), _dead_letter(reason, device, path, body))]
            )
            self.counts["unknown_device" if known is None else "unauthorized"] += 1
            raise failure
        try:
            parsed = json.loads(body)
        except ValueError as exc:
            await self.delivery.send(
                [(dlq, device.encode(), _dead_letter(f"not JSON: {exc}", device, path, body))]
            )
            self.counts["not_json"] += 1
            raise GatewayBadRequestError(f"the body is not JSON: {exc}") from None
        items = parsed if isinstance(parsed, list) else [parsed]
        if len(items) > MAX_BATCH:
            raise GatewayBadRequestError(
                f"a batch holds at most {MAX_BATCH} items, not {len(items)}"
            )
        records: list[tuple[str, bytes, bytes]] = []
        rejected: list[dict[str, Any]] = []
        key = device.encode()
        for index, item in enumerate(items):
            problem = self._check(item, schema, device)
            # A good item with the device the path names, where the item did not name it.
            raw = json.dumps(item).encode()
            if problem is None:
                records.append((topic, key, raw))
            else:
                rejected.append({"index": index, "error": problem})
                records.append((dlq, key, _dead_letter(problem, device, path, raw, index)))
        await self.delivery.send(records)
        self.counts["accepted"] += len(items) - len(rejected)
        self.counts["rejected"] += len(rejected)
        return {"accepted": len(items) - len(rejected), "rejected": rejected}

    @staticmethod
    def _check(item: Any, schema: type[_Item], device: str) -> str | None:
        if not isinstance(item, dict):
            return f"an item must be a JSON object, not {type(item).__name__}"
        try:
            parsed = schema.model_validate(item)
        except ValidationError as exc:
            return _problem(exc)
        if parsed.device is not None and parsed.device != device:
            return f"device: {parsed.device!r} is not the device of the path, {device!r}"
        if parsed.device is None:
            item["device"] = device
        return None

    def stats(self) -> dict[str, Any]:
        delivery = self.delivery
        return {
            "devices": len(self.registry),
            "kafka": "down" if delivery is not None and delivery.down_since else "up",
            "in_flight": delivery.in_flight if delivery is not None else 0,
            "counts": dict(self.counts),
        }


def create_app(gateway: Gateway, on_stop: Callable[[], None] | None = None) -> FastAPI:
    """The gateway's HTTP API; the gateway starts and stops with the app, and ``on_stop``
    is called once it has stopped."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(gateway.start)
        try:
            yield
        finally:
            await asyncio.to_thread(gateway.stop)
            if on_stop is not None:
                on_stop()

    app = FastAPI(title="kappaflow gateway", lifespan=lifespan)

    @app.exception_handler(GatewayError)
    async def _error(_request: Request, exc: GatewayError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
        if exc.status in (429, 503):
            gateway.counts[f"status_{exc.status}"] += 1
        return JSONResponse(
            {"code": exc.code, "error": str(exc)}, status_code=exc.status, headers=headers
        )

    async def body_of(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise GatewayBadRequestError(f"the body is larger than {MAX_BODY_BYTES} bytes")
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            raise GatewayBadRequestError(f"the body is larger than {MAX_BODY_BYTES} bytes")
        return body

    def token_of(request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    @app.post("/v1/devices/{device}/readings")
    async def readings(device: str, request: Request) -> dict[str, Any]:
        body = await body_of(request)
        topic = gateway.config.readings_topic
        return await gateway.accept(
            device, token_of(request), body, ReadingIn, topic, request.url.path
        )

    @app.post("/v1/devices/{device}/events")
    async def events(device: str, request: Request) -> dict[str, Any]:
        body = await body_of(request)
        topic = gateway.config.events_topic
        return await gateway.accept(
            device, token_of(request), body, EventIn, topic, request.url.path
        )

    @app.get("/v1/health")
    async def health() -> JSONResponse:
        stats = gateway.stats()
        return JSONResponse(stats, status_code=503 if stats["kafka"] == "down" else 200)

    return app
