"""The kappaflow service: its answers about a real job's results, its errors, and the
process `kappaflow api` and `up` manage.

One job (tests/support/served.py) counts views per page and 10 s window and keeps each
user's latest view, both in the real serving store; the service is asked about them and
its answers are checked against the views sent, computed here without the engine.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import error_line, run_kappaflow
from fastapi.routing import APIRoute, APIWebSocketRoute
from service import (
    BASE,
    VIEWS,
    WATERMARK,
    WINDOW_MS,
    Served,
    at,
    expected_windows,
    serve,
    served_app,
)

from kappaflow.procs import free_port
from kappaflow.settings import Settings, load_settings, settings_json
from test_docs import documented_endpoints


@pytest.fixture(scope="module")
def api(served: Served) -> Iterator[httpx.Client]:
    with serve(served.settings) as client:
        yield client


def items(answer: httpx.Response) -> list[dict[str, Any]]:
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()["items"]
    return found


def test_jobs_and_their_accounting(api: httpx.Client, served: Served) -> None:
    job = served.job
    listed = {j["name"]: j for j in items(api.get("/v1/jobs"))}
    assert listed[job]["state"] == "running" and listed[job]["pipeline"] == "served:build"
    status = api.get(f"/v1/jobs/{job}").json()
    assert status["state"] == "running"
    assert status["outputs"]["pages"]["events"] == 25
    assert status["outputs"]["pages"]["events_read"] == 25
    # The plan its driver recorded: where each output goes.
    sinks = {o["name"]: o["sinks"] for o in status["plan"]["outputs"]}
    assert {"kafka": f"{job}.pages"}.items() <= sinks["pages"][1].items()
    lake = Path(sinks["last_view"][1]["location"])
    assert lake == Path(served.settings.lake_root) / job / "last_view" and lake.is_dir()
    outputs = {o["output"]: o["stats"] for o in items(api.get(f"/v1/jobs/{job}/outputs"))}
    # ``clicks`` reads the live topic, which the push tests add to.
    assert {"pages", "last_view"} <= set(outputs)
    assert outputs["pages"]["duplicates"] == outputs["pages"]["late"] == 0


def test_a_keys_windows_in_a_range_and_page_by_page(api: httpx.Client, served: Served) -> None:
    job = served.job
    base = f"/v1/jobs/{job}/outputs/pages"
    keys: list[Any] = items(api.get(f"{base}/keys"))
    assert keys == [["/p0"], ["/p1"], ["/p2"], ["/p3"]]
    wanted = expected_windows()
    for page in ("/p0", "/p3"):
        windows = items(api.get(f"{base}/windows", params={"key": page}))
        assert [(w["window_start"], w["values"]["views"]) for w in windows] == [
            (at(start), n) for (p, start), n in sorted(wanted.items()) if p == page
        ]
        assert [w["final"] for w in windows] == [
            w["window_start"] <= at(WATERMARK - WINDOW_MS) for w in windows
        ]
    # The same windows a page of one at a time, following `next`; the key as JSON.
    paged, cursor = [], None
    while True:
        params: dict[str, str | int] = {"key": '["/p1"]', "limit": 1}
        if cursor is not None:
            params["after"] = cursor
        answer = api.get(f"{base}/windows", params=params).json()
        paged += answer["items"]
        cursor = answer["next"]
        if cursor is None:
            break
    assert paged == items(api.get(f"{base}/windows", params={"key": "/p1"}))
    assert len(paged) == 4
    # A range of starts, and final windows only.
    ranged = items(
        api.get(
            f"{base}/windows",
            params={"key": "/p1", "from": at(BASE + 10_000), "to": at(BASE + 30_000)},
        )
    )
    assert [w["window_start"] for w in ranged] == [at(BASE + 10_000), at(BASE + 20_000)]
    final = items(api.get(f"{base}/windows", params={"key": "/p1", "final": "true"}))
    assert [w["window_start"] for w in final] == [at(BASE), at(BASE + 10_000)]


def test_the_latest_windows_and_the_top_keys_of_a_window(api: httpx.Client, served: Served) -> None:
    job = served.job
    base = f"/v1/jobs/{job}/outputs/pages"
    wanted = expected_windows()
    newest = items(api.get(f"{base}/windows/latest", params={"limit": 3}))
    last_start = max(start for _, start in wanted)
    assert [(w["key"], w["window_start"]) for w in newest] == [
        ([p], at(last_start)) for p in sorted(p for p, s in wanted if s == last_start)
    ][:3]
    start = BASE + 10_000
    ranking: dict[str, str | int] = {"window_start": at(start), "field": "views", "limit": 2}
    top = items(api.get(f"{base}/top", params=ranking))
    ranked = sorted(((-n, p) for (p, s), n in wanted.items() if s == start))[:2]
    assert [(w["key"], w["values"]["views"]) for w in top] == [([p], -m) for m, p in ranked]


def test_a_keyed_streams_latest_record_per_key(api: httpx.Client, served: Served) -> None:
    job = served.job
    latest = f"/v1/jobs/{job}/outputs/last_view/latest"
    rows = items(api.get(latest))
    last: dict[str, dict[str, Any]] = {}
    for view in sorted(VIEWS, key=lambda v: v["at"]):
        last[view["user"]] = view
    seen = Counter(view["user"] for view in VIEWS)
    assert [r["key"] for r in rows] == [["u0"], ["u1"], ["u2"], ["u3"]]
    for row in rows:
        user = row["key"][0]
        assert row["record"]["page"] == last[user]["page"]
        assert row["record"]["at"] == last[user]["at"]
        assert row["record"]["views"] == seen[user]
        assert row["record"]["regular"] is (seen[user] >= 3)
    first = api.get(latest, params={"limit": 2}).json()
    assert [r["key"] for r in first["items"]] == [["u0"], ["u1"]] and first["next"] == '["u1"]'
    rest = api.get(latest, params={"after": first["next"]}).json()
    assert [r["key"] for r in rest["items"]] == [["u2"], ["u3"]] and rest["next"] is None
    # Only the records whose field is set (as open alerts are those with rules open).
    regulars = items(api.get(latest, params={"has": "regular"}))
    assert [r["key"] for r in regulars] == [["u0"], ["u1"], ["u2"]]
    assert items(api.get(latest, params={"has": "no_such_field"})) == []


@pytest.mark.parametrize(
    ("path", "params", "status", "code"),
    [
        ("/v1/jobs/no-such-job", {}, 404, "KF601"),
        ("/v1/jobs/no-such-job/outputs", {}, 404, "KF601"),
        ("/v1/jobs/{job}/outputs/nothing/keys", {}, 404, "KF852"),
        ("/v1/jobs/{job}/outputs/pages/windows", {"key": "/nowhere"}, 404, "KF855"),
        ("/v1/jobs/{job}/outputs/pages/windows", {"key": "[not json"}, 400, "KF851"),
        ("/v1/jobs/{job}/outputs/pages/windows", {"key": "/p1", "from": "yesterday"}, 400, "KF851"),
        ("/v1/jobs/{job}/outputs/pages/windows", {}, 400, "KF851"),
        ("/v1/jobs/{job}/outputs/pages/keys", {"limit": "0"}, 400, "KF851"),
        ("/v1/jobs/{job}/outputs/pages/keys", {"limit": "1001"}, 400, "KF851"),
        ("/v1/jobs/{job}/outputs/pages/top", {"window_start": "soon"}, 400, "KF851"),
        ("/v1/jobs/{job}/outputs/pages/top", {"window_start": "{start}"}, 400, "KF851"),
        ("/v2/jobs", {}, 404, "KF853"),
    ],
)
def test_bad_requests_get_a_code_and_their_status(
    api: httpx.Client,
    served: Served,
    path: str,
    params: dict[str, str],
    status: int,
    code: str,
) -> None:
    given = {k: v.format(start=at(BASE)) for k, v in params.items()}  # "count": not there
    answer = api.get(path.format(job=served.job), params=given)
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["code"] == code and body["error"]
    assert api.post("/v1/jobs").json()["code"] == "KF853"


def test_the_endpoint_table_is_every_route_and_the_openapi_description(
    api: httpx.Client,
) -> None:
    """docs/api.md's table of endpoints names every route the application answers, and
    the OpenAPI description every HTTP one but the dashboard's redirects (the WebSocket
    is not HTTP)."""
    app = served_app(api)
    routes: set[tuple[str, str]] = set()
    described_routes: set[tuple[str, str]] = set()
    for route in app.routes:
        if isinstance(route, APIRoute):
            methods = {(method, route.path) for method in route.methods or ()}
            routes |= methods
            if route.include_in_schema:
                described_routes |= methods
        elif isinstance(route, APIWebSocketRoute):
            routes.add(("WS", route.path))
    documented = documented_endpoints()
    assert routes == documented, (
        f"routes not in docs/api.md: {sorted(routes - documented)}; "
        f"documented but not routes: {sorted(documented - routes)}"
    )
    described = {
        (method.upper(), path)
        for path, methods in api.get("/openapi.json").json()["paths"].items()
        for method in methods
    }
    assert described == described_routes
    assert {path for _, path in routes - described_routes} == {
        "/",
        "/dashboard",
        "/v1/jobs/{job}/outputs/{output}/changes/ws",
    }


def test_api_start_status_stop_as_a_process(serving: Settings) -> None:
    env = {"KAPPAFLOW_API__PORT": str(free_port())}
    started = run_kappaflow(serving, "api", "start", env=env)
    try:
        assert started.code == 0, started.err
        url = started.err.strip().rsplit(" ", 1)[-1]
        assert started.err.startswith("api started on http://127.0.0.1:")
        health = httpx.get(f"{url}/v1/health").json()
        assert health["status"] == "ok" and health["serving_store"] is True
        again = run_kappaflow(serving, "api", "start", env=env)
        assert again.err.startswith("api already running")
        status = json.loads(run_kappaflow(serving, "api", "status", "--json", env=env).out)
        assert status["state"] == "running" and status["url"] == url
        rows = run_kappaflow(serving, "status", "--json", env=env).lines()
        assert {"service": "api", "state": "running"}.items() <= json.loads(rows[-1]).items()
    finally:
        stopped = run_kappaflow(serving, "api", "stop", env=env)
    assert stopped.code == 0 and stopped.err.strip() == "api stopped"
    status = json.loads(run_kappaflow(serving, "api", "status", "--json", env=env).out)
    assert status["state"] == "stopped"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/v1/health")


def test_the_service_gets_its_starters_settings_whole(tmp_path: Path) -> None:
    """Settings given in code, not by flags or the environment, reach the service, a
    secret included."""
    given = load_settings(
        state_dir=tmp_path,
        redis={"port": 1234},
        kafka={"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "p@ss"},
        spark={"conf": {"spark.x": "1"}},
    )
    back = Settings.model_validate_json(settings_json(given))
    assert back == given and back.kafka.sasl_password is not None
    assert back.kafka.sasl_password.get_secret_value() == "p@ss"


def test_listening_beyond_loopback_is_refused(serving: Settings) -> None:
    env = {"KAPPAFLOW_API__HOST": "0.0.0.0", "KAPPAFLOW_API__PORT": str(free_port())}
    refused = run_kappaflow(serving, "api", "start", env=env)
    assert "loopback" in error_line(refused, "KF854", 1)
    status = json.loads(run_kappaflow(serving, "api", "status", "--json", env=env).out)
    assert status["state"] == "stopped"
