"""API tokens with scopes: the service open until a token exists, then only to tokens;
the dashboard's session cookie; revocation; the CLI; a bind beyond loopback.

Each test has a state directory of its own (its tokens file), on the session's broker and Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import error_line, run_kappaflow
from service import serve
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin

from kappaflow.api.auth import COOKIE, Role, TokenStore, tokens_path
from kappaflow.api.server import check_bind
from kappaflow.errors import ApiBindRefusedError, UnauthorizedError
from kappaflow.settings import Settings


@pytest.fixture
def own(serving: Settings, tmp_path: Path) -> Settings:
    return serving.model_copy(update={"state_dir": tmp_path / "state"})


@pytest.fixture
def api(own: Settings) -> Iterator[httpx.Client]:
    with serve(own) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_without_tokens_the_service_answers_anyone(api: httpx.Client) -> None:
    assert api.get("/v1/jobs").status_code == 200
    assert api.get("/v1/session").json() == {
        "tokens_required": False,
        "token": None,
        "scope": None,
    }


def test_once_a_token_exists_requests_need_one(api: httpx.Client, own: Settings) -> None:
    store = TokenStore(tokens_path(own))
    reader = store.create("grafana", Role.READ)
    assert reader.startswith("kf_")
    assert reader not in tokens_path(own).read_text()  # kept hashed only
    assert tokens_path(own).stat().st_mode & 0o777 == 0o600

    refused = api.get("/v1/jobs")
    assert refused.status_code == 401 and refused.json()["code"] == "KF890"
    assert refused.headers["www-authenticate"] == "Bearer"
    wrong = api.get("/v1/jobs", headers=bearer(reader + "x"))
    assert wrong.status_code == 401 and wrong.json()["code"] == UnauthorizedError.code
    for path in ("/v1/jobs", "/v1/topics", "/v1/sql/tables", "/metrics"):
        assert api.get(path, headers=bearer(reader)).status_code == 200, path
        assert api.get(path).status_code == 401, path
    # What holds nothing of a job's stays open: health, the API's description, the
    # dashboard's files.
    for path in ("/v1/health", "/openapi.json", "/dashboard/"):
        assert api.get(path).status_code == 200, path


def test_the_admin_scope_manages_tokens_and_read_does_not(api: httpx.Client, own: Settings) -> None:
    store = TokenStore(tokens_path(own))
    admin, reader = store.create("ops", Role.ADMIN), store.create("viewer", Role.READ)
    forbidden = api.post("/v1/tokens", json={"name": "x"}, headers=bearer(reader))
    assert forbidden.status_code == 403 and forbidden.json()["code"] == "KF891"
    for method, path in (("GET", "/v1/tokens"), ("DELETE", "/v1/tokens/ops")):
        refused = api.request(method, path, headers=bearer(reader))
        assert (refused.status_code, refused.json()["code"]) == (403, "KF891"), (method, path)
    made = api.post("/v1/tokens", json={"name": "ci", "scope": "read"}, headers=bearer(admin))
    assert made.status_code == 201, made.text
    new = made.json()["token"]
    assert api.get("/v1/jobs", headers=bearer(new)).status_code == 200
    names = [t["name"] for t in api.get("/v1/tokens", headers=bearer(admin)).json()["items"]]
    assert sorted(names) == ["ci", "ops", "viewer"]
    again = api.post("/v1/tokens", json={"name": "ci"}, headers=bearer(admin))
    assert again.status_code == 409 and again.json()["code"] == "KF893"
    revoked = api.delete("/v1/tokens/ci", headers=bearer(admin))
    assert revoked.status_code == 200
    # Revoked: refused at once.
    assert api.get("/v1/jobs", headers=bearer(new)).status_code == 401
    gone = api.delete("/v1/tokens/ci", headers=bearer(admin))
    assert gone.status_code == 404 and gone.json()["code"] == "KF892"
    for name in ("a b", "ops\n"):
        bad = api.post("/v1/tokens", json={"name": name}, headers=bearer(admin))
        assert bad.status_code == 400 and bad.json()["code"] == "KF851"


def test_the_dashboard_signs_in_with_a_cookie_not_a_url(api: httpx.Client, own: Settings) -> None:
    reader = TokenStore(tokens_path(own)).create("me", Role.READ)
    wrong = api.post("/v1/session", json={"token": "kf_nope"})
    assert wrong.status_code == 401 and COOKIE not in wrong.cookies
    signed = api.post("/v1/session", json={"token": reader})
    assert signed.status_code == 200 and signed.json() == {"token": "me", "scope": "read"}
    set_cookie = signed.headers["set-cookie"].lower()
    assert "httponly" in set_cookie and "samesite=strict" in set_cookie
    assert reader not in signed.headers["set-cookie"]  # a session id, not the token
    # The client keeps the cookie: the session's requests pass.
    assert api.get("/v1/jobs").status_code == 200
    assert api.get("/v1/session").json()["token"] == "me"
    # A WebSocket with the session's cookie passes the door, one without is closed
    # before it opens.
    url = str(api.base_url).replace("http://", "ws://") + "/v1/jobs/none/outputs/x/changes/ws"
    cookie = {"Cookie": f"{COOKIE}={api.cookies[COOKIE]}"}
    home = Origin(str(api.base_url))
    with connect(url, additional_headers=cookie, origin=home, open_timeout=30) as socket:
        message = json.loads(socket.recv(timeout=30))
        assert message["data"]["code"] == "KF601"  # past the door: the job is unknown
    # Without the cookie, or with it from another page, it is closed before it opens.
    for headers, origin in (({}, home), (cookie, Origin("http://127.0.0.1:1"))):
        with pytest.raises(InvalidStatus):
            connect(url, additional_headers=headers, origin=origin, open_timeout=30)
    # A change with the cookie comes from the dashboard's own page, not another's.
    admin = TokenStore(tokens_path(own)).create("boss", Role.ADMIN)
    assert api.post("/v1/session", json={"token": admin}).status_code == 200
    elsewhere = api.post("/v1/tokens", json={"name": "x"}, headers={"Origin": "http://evil"})
    assert elsewhere.status_code == 403 and elsewhere.json()["code"] == "KF891"
    made = api.post("/v1/tokens", json={"name": "x"}, headers={"Origin": str(api.base_url)})
    assert made.status_code == 201, made.text
    # A token revoked and made again under its name does not bring its sessions back.
    TokenStore(tokens_path(own)).revoke("boss")
    TokenStore(tokens_path(own)).create("boss", Role.ADMIN)
    assert api.get("/v1/jobs").status_code == 401
    assert api.delete("/v1/session").status_code == 200


def test_tokens_from_the_command_line(own: Settings) -> None:
    created = run_kappaflow(own, "api", "token", "create", "deploy", "--scope", "admin")
    assert created.code == 0, created.err
    token = created.out.strip().splitlines()[-1]
    assert TokenStore(tokens_path(own)).check(token) is not None
    listed = [
        json.loads(line) for line in run_kappaflow(own, "api", "token", "list", "--json").lines()
    ]
    assert [(t["name"], t["scope"]) for t in listed] == [("deploy", "admin")]
    twice = run_kappaflow(own, "api", "token", "create", "deploy")
    assert twice.code == 1 and twice.err.startswith("kappaflow: error[KF893]: ")
    assert run_kappaflow(own, "api", "token", "revoke", "deploy").code == 0
    missing = run_kappaflow(own, "api", "token", "revoke", "deploy")
    assert missing.code == 1 and missing.err.startswith("kappaflow: error[KF892]: ")
    assert TokenStore(tokens_path(own)).tokens() == {}


def test_a_bind_beyond_loopback_needs_tokens_and_fails_closed_without(own: Settings) -> None:
    wide = own.model_copy(update={"api": own.api.model_copy(update={"host": "0.0.0.0"})})
    with pytest.raises(ApiBindRefusedError, match="token"):
        check_bind(wide)
    store = TokenStore(tokens_path(own))
    token = store.create("net", Role.READ)
    check_bind(wide)  # tokens exist: the service may listen beyond loopback
    with serve(wide) as api:
        assert api.get("/v1/jobs", headers=bearer(token)).status_code == 200
        store.revoke("net")
        # Its last token gone, a service that listens beyond loopback refuses everyone.
        closed = api.get("/v1/jobs")
        assert closed.status_code == 401 and "no API token left" in closed.json()["error"]
        assert api.get("/v1/health").status_code == 200


def test_a_tokens_file_that_cannot_be_read_refuses_everyone(
    api: httpx.Client, own: Settings
) -> None:
    TokenStore(tokens_path(own)).create("a", Role.READ)
    tokens_path(own).write_text("{not json")
    refused = api.get("/v1/jobs")
    assert refused.status_code == 401 and "cannot be read" in refused.json()["error"]
    assert api.get("/v1/health").status_code == 200
    broken = run_kappaflow(own, "api", "token", "create", "b")
    assert "cannot be read" in error_line(broken, "KF894", 1)
