"""The kappaflow service's HTTP API: the jobs, their status and their results.

Every answer is JSON; every error is ``{"code": "KFnnn", "error": "..."}`` with the
status of its kind (docs/errors.md). The OpenAPI description is at ``/openapi.json``.

- ``GET /v1/health``: the service and the embedded services it sees.
- ``GET /v1/jobs``, ``GET /v1/jobs/{job}``: the jobs; one job's record, its outputs'
  accounting (events, duplicates, late, dead letters, events read) and their queries'
  last progress (rates, batch duration, watermark, state rows, lag).
- ``GET /v1/jobs/{job}/dead-letters``: the job's dead letters (jobs/dead_letters.py).
- ``GET /v1/jobs/{job}/outputs``: the outputs that write to the serving store, with
  their running totals; under ``/v1/jobs/{job}/outputs/{output}/``: ``keys``, a key's
  ``windows`` in a time range, the ``windows/latest`` across keys, the ``top`` keys of
  a window, and a keyed stream's ``latest`` record per key.
- ``GET /v1/jobs/{job}/diff``: the job's windows against its shadow's (``jobs diff``).

Keys are given as the store holds them, a JSON array of the key's columns
(``["dev-1","cpu_temp"]``); a key of one column may be given as its bare text (``/home``).
Times are ISO 8601 with a zone (``2026-11-27T10:00:00Z``), epoch milliseconds, ``now``
or a duration ago (``15m``); pages end with ``next``, the cursor of the
following page, or null.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import redis
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kappaflow import __version__
from kappaflow.api import results
from kappaflow.api.auth import add_auth
from kappaflow.api.dashboard import add_dashboard
from kappaflow.api.metrics import add_metrics
from kappaflow.api.push import add_push_routes
from kappaflow.api.sql import add_sql_routes
from kappaflow.api.topics import add_topic_routes
from kappaflow.errors import (
    ApiBadRequestError,
    ApiError,
    ApiPathNotFoundError,
    KappaflowError,
    UnknownKeyError,
    UnknownOutputError,
    http_status,
)
from kappaflow.jobs.manager import JobManager
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings
from kappaflow.timeutil import parse_time, to_epoch_ms

MAX_LIMIT = 1000
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="at most this many items")]


def _error(code: str, message: str, status: int) -> JSONResponse:
    return JSONResponse({"code": code, "error": message}, status_code=status)


def create_app(settings: Settings) -> FastAPI:
    """The service's application over ``settings``' jobs and serving store."""
    app = FastAPI(
        title="kappaflow",
        version=__version__,
        description="The jobs, their status and their results.",
        # The interactive pages load their scripts from a CDN: /openapi.json is enough.
        docs_url=None,
        redoc_url=None,
    )
    store: redis.Redis = redis_client(settings)
    jobs = JobManager(settings)

    @app.exception_handler(KappaflowError)
    async def kappaflow_error(_request: Request, exc: KappaflowError) -> JSONResponse:
        return _error(exc.code, str(exc), http_status(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'request'}: {e['msg']}"
            for e in exc.errors()
        )
        return _error(ApiBadRequestError.code, problems, ApiBadRequestError.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):
            return _error(
                ApiPathNotFoundError.code,
                f"no endpoint {request.method} {request.url.path}",
                ApiPathNotFoundError.status,
            )
        return _error(ApiError.code, str(exc.detail), exc.status_code)

    @app.exception_handler(redis.RedisError)
    async def store_down(_request: Request, exc: redis.RedisError) -> JSONResponse:
        return _error(ApiError.code, f"the serving store did not answer: {exc}", 503)

    @app.get("/v1/health", summary="The service is up; the serving store answers or not.")
    def health() -> dict[str, Any]:
        try:
            store_up = bool(store.ping())
        except redis.RedisError:
            store_up = False
        return {"status": "ok", "version": __version__, "serving_store": store_up}

    @app.get("/v1/jobs", summary="Every job: name, state, pipeline, start.")
    def list_jobs() -> dict[str, Any]:
        return {
            "items": [
                {
                    "name": r.name,
                    "state": str(r.state),
                    "pipeline": r.pipeline,
                    "started_at": r.started_at,
                    "ended_at": r.ended_at,
                    "error": r.error,
                }
                for r in jobs.records()
            ]
        }

    @app.get(
        "/v1/jobs/{job}",
        summary="A job's record, its outputs' accounting and progress, and its plan.",
    )
    def job_status(job: str) -> dict[str, Any]:
        from kappaflow.jobs.status import job_status

        return {**job_status(settings, job), "plan": jobs.plan(job)}

    @app.get(
        "/v1/jobs/{job}/state",
        summary="A job's state as of its last committed batch (or a savepoint's): open "
        "windows with their values, a stateful function's keys with their state and timers.",
    )
    def job_state(
        job: str, output: str | None = None, key: str | None = None, at: str | None = None
    ) -> Any:
        from kappaflow.api.state import read_job_state

        known_job(job)
        found = read_job_state(settings, job, output=output, key=key, at=at)
        if found.error is not None:
            return _error(found.error["code"], found.error["message"], found.error["status"])
        return {"items": found.rows}

    @app.get(
        "/v1/jobs/{job}/dead-letters",
        summary="The job's dead letters: reason, source, original bytes, replayed or not.",
    )
    def job_dead_letters(
        job: str,
        limit: Limit = 100,
        pending: Annotated[bool, Query(description="only those no replay has passed")] = False,
    ) -> dict[str, Any]:
        from kappaflow.jobs.dead_letters import dead_letters

        found = dead_letters(settings, job)
        if pending:
            found = [letter for letter in found if not letter.replayed]
        return {"items": [letter.as_json() for letter in found[:limit]]}

    @app.get(
        "/v1/jobs/{job}/diff",
        summary="Per output, the windows whose final values differ between the job and its shadow.",
    )
    def job_diff(job: str, sample: int = 5) -> dict[str, Any]:
        from kappaflow.jobs.diff import job_diff

        return job_diff(settings, job, sample=sample)

    def known_job(job: str) -> None:
        jobs.get(job)  # JobNotFoundError (KF601, 404) for a job never started

    def known_output(job: str, output: str) -> None:
        known_job(job)
        if not results.has_output(store, job, output):
            raise UnknownOutputError(
                f"job {job!r} has no output {output!r} in the serving store "
                f"(its outputs: {', '.join(results.outputs(store, job)) or 'none yet'})"
            )

    @app.get("/v1/jobs/{job}/outputs", summary="The job's outputs in the serving store.")
    def list_outputs(job: str) -> dict[str, Any]:
        known_job(job)
        return {
            "items": [
                {"output": output, "stats": results.stats(store, job, output)}
                for output in results.outputs(store, job)
            ]
        }

    @app.get("/v1/jobs/{job}/outputs/{output}/keys", summary="The output's keys, by key.")
    def list_keys(
        job: str,
        output: str,
        after: Annotated[str | None, Query(description="the last key of the page before")] = None,
        limit: Limit = 100,
    ) -> dict[str, Any]:
        known_output(job, output)
        names = results.keys(store, job, output)
        if after is not None:
            names = [k for k in names if k > _key(after)]
        page = names[:limit]
        return {
            "items": [json.loads(k) for k in page],
            "next": page[-1] if len(names) > limit else None,
        }

    @app.get(
        "/v1/jobs/{job}/outputs/{output}/windows",
        summary="A key's windows, oldest first, in a range of window starts.",
    )
    def key_windows(
        job: str,
        output: str,
        key: Annotated[str, Query(description='the key: ["a","b"], or the text of one')],
        start_from: Annotated[
            str | None, Query(alias="from", description="windows starting at or after")
        ] = None,
        start_to: Annotated[
            str | None, Query(alias="to", description="windows starting before")
        ] = None,
        final: Annotated[bool, Query(description="final windows only")] = False,
        after: Annotated[
            str | None, Query(description="the last window start of the page before")
        ] = None,
        limit: Limit = 100,
    ) -> dict[str, Any]:
        known_output(job, output)
        wanted = _key(key)
        if not results.has_key(store, job, output, wanted):
            raise UnknownKeyError(
                f"output {output!r} of job {job!r} has no windows for the key {wanted}"
            )
        lower = _instant(start_from, "from")
        if after is not None:
            cursor = _moment(after, "after")
            lower = cursor + 1 if lower is None else max(lower, cursor + 1)
        found = results.windows(
            store,
            job,
            output,
            wanted,
            start_from=lower,
            start_before=_instant(start_to, "to"),
            final_only=final,
        )
        page = found[:limit]
        items = [w.as_json() for w in page]
        return {"items": items, "next": items[-1]["window_start"] if len(found) > limit else None}

    @app.get(
        "/v1/jobs/{job}/outputs/{output}/windows/latest",
        summary="The windows with the latest starts across every key, newest first.",
    )
    def newest_windows(
        job: str,
        output: str,
        final: Annotated[bool, Query(description="final windows only")] = False,
        limit: Limit = 100,
    ) -> dict[str, Any]:
        known_output(job, output)
        found = results.latest_windows(store, job, output, limit=limit, final_only=final)
        return {"items": [w.as_json() for w in found]}

    @app.get(
        "/v1/jobs/{job}/outputs/{output}/top",
        summary="The keys with the largest value of a field in one window.",
    )
    def top(
        job: str,
        output: str,
        window_start: Annotated[str, Query(description="the window's start")],
        field: Annotated[str, Query(description="the value to rank by")] = "count",
        limit: Limit = 10,
    ) -> dict[str, Any]:
        known_output(job, output)
        start = _moment(window_start, "window_start")
        found = results.top_keys(store, job, output, start, field=field, limit=limit)
        return {"items": [w.as_json() for w in found]}

    @app.get(
        "/v1/jobs/{job}/outputs/{output}/latest",
        summary="A keyed stream's latest record per key, by key.",
    )
    def latest(
        job: str,
        output: str,
        after: Annotated[str | None, Query(description="the last key of the page before")] = None,
        has: Annotated[
            str | None,
            Query(description="only records whose field is set: true, non-zero, non-empty"),
        ] = None,
        limit: Limit = 100,
    ) -> dict[str, Any]:
        known_output(job, output)
        rows, following = results.latest_records(
            store,
            job,
            output,
            after=_key(after) if after is not None else None,
            limit=limit,
            has=has,
        )
        return {"items": rows, "next": following}

    # The door first: the metrics' middleware, added after it, wraps it and counts refusals.
    add_auth(app, settings)
    add_dashboard(app)
    add_push_routes(app, settings)
    add_metrics(app, settings)
    add_topic_routes(app, settings)
    add_sql_routes(app, settings)
    return app


def _key(given: str) -> str:
    """A key as the store holds it (JSON array text) from ``given``: a JSON array, or the
    text of a key of one column."""
    if given.startswith("["):
        try:
            parsed = json.loads(given)
        except ValueError:
            raise ApiBadRequestError(f"key {given!r} is not a JSON array") from None
        if not isinstance(parsed, list) or not parsed:
            raise ApiBadRequestError(f"key {given!r} is not a JSON array of the key's columns")
    else:
        parsed = [given]
    return json.dumps(parsed, ensure_ascii=False)


def _instant(given: str | None, name: str) -> int | None:
    """``given`` as epoch ms (see ``_moment``), or None when not given."""
    return None if given is None else _moment(given, name)


def _moment(given: str, name: str) -> int:
    """``given`` as epoch ms: ISO 8601 with a zone, epoch ms, ``now`` or a duration ago."""
    try:
        return to_epoch_ms(parse_time(given))
    except KappaflowError as exc:
        raise ApiBadRequestError(f"{name}: {exc}") from None
