"""API tokens with scopes, and the service's door: who may ask what.

A token is created with ``kappaflow api token create NAME --scope read|admin``, shown
once, and kept only as its SHA-256 in ``<state_dir>/api/tokens.json`` (mode 0600). Once
one token exists, every request but the open ones (``OPEN``: health, the OpenAPI
description, the dashboard's own files and its sign-in) needs one, in an ``Authorization:
Bearer`` header or, for the dashboard, in a session cookie that signing in sets: a token
never travels in a URL. ``read`` lets a client read everything the service answers
(results, SQL over the lake, push, topics, metrics); ``admin`` also manages the tokens
(``/v1/tokens``). Without tokens the service answers anyone who reaches it, which is why
it then listens on loopback only (KF854).

The file is read again when it changes, so a token created or revoked from the command
line counts at once, in a running service too.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import StrEnum
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from kappaflow.errors import (
    ApiBadRequestError,
    DuplicateTokenError,
    ForbiddenError,
    UnauthorizedError,
    UnknownTokenError,
)
from kappaflow.settings import Settings
from kappaflow.timeutil import iso

TOKEN_PREFIX = "kf_"
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
COOKIE = "kf_session"
#: How long a dashboard session lasts without a request.
SESSION_IDLE_S = 8 * 3600
#: Paths anyone may reach: nothing in them is a job's.
OPEN = ("/v1/health", "/openapi.json", "/v1/session")
OPEN_PREFIXES = ("/dashboard",)

Scope = Any  # a Scope of ASGI's: a dict
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Role(StrEnum):
    READ = "read"
    ADMIN = "admin"


@dataclass(frozen=True)
class TokenInfo:
    name: str
    scope: Role
    created_at: str
    #: The SHA-256 of the token, hex.
    digest: str

    def public(self) -> dict[str, str]:
        return {"name": self.name, "scope": str(self.scope), "created_at": self.created_at}


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tokens_path(settings: Settings) -> Path:
    return settings.state_dir / "api" / "tokens.json"


class TokenStore:
    """The service's tokens, from their file (read again when it changes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[float, int] | None = None
        self._tokens: dict[str, TokenInfo] = {}

    def tokens(self) -> dict[str, TokenInfo]:
        """The tokens by name (none when the file does not exist)."""
        with self._lock:
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                self._seen, self._tokens = None, {}
                return {}
            stamp = (stat.st_mtime, stat.st_size)
            if stamp != self._seen:
                body = json.loads(self.path.read_text())
                self._tokens = {
                    t["name"]: TokenInfo(t["name"], Role(t["scope"]), t["created_at"], t["digest"])
                    for t in body.get("tokens", [])
                }
                self._seen = stamp
            return dict(self._tokens)

    def enabled(self) -> bool:
        return bool(self.tokens())

    def check(self, token: str) -> TokenInfo | None:
        """The token's record, or None for a token this service does not have."""
        wanted = _digest(token)
        found = None
        for info in self.tokens().values():
            # Every record compared, in constant time each: no early answer to time.
            if hmac.compare_digest(info.digest, wanted):
                found = info
        return found

    def create(self, name: str, scope: Role) -> str:
        """A new token named ``name``; the only time the token itself is known."""
        if not _NAME.match(name):
            raise ApiBadRequestError(
                f"token name {name!r}: use 1 to 64 letters, digits, '.', '_' and '-'"
            )
        tokens = self.tokens()
        if name in tokens:
            raise DuplicateTokenError(f"a token named {name!r} exists: revoke it first")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        tokens[name] = TokenInfo(name, scope, iso(datetime.now(UTC)), _digest(token))
        self._save(tokens)
        return token

    def revoke(self, name: str) -> None:
        tokens = self.tokens()
        if name not in tokens:
            raise UnknownTokenError(f"no token named {name!r} (see `kappaflow api token list`)")
        del tokens[name]
        self._save(tokens)

    def _save(self, tokens: dict[str, TokenInfo]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {"tokens": [{**asdict(t), "scope": str(t.scope)} for t in tokens.values()]}
        # Readable by its owner only from the start, then swapped in whole.
        scratch = self.path.with_name(f".{self.path.name}.tmp")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(body, indent=2) + "\n")
        scratch.replace(self.path)


@dataclass
class Session:
    token: str  # the token's name
    scope: Role
    last_seen: float


class Door:
    """Who a request comes from, and whether it may have what it asks."""

    def __init__(self, store: TokenStore) -> None:
        self.store = store
        self.sessions: dict[str, Session] = {}

    def open_session(self, info: TokenInfo) -> str:
        session_id = secrets.token_urlsafe(32)
        self.sessions[session_id] = Session(info.name, info.scope, time.monotonic())
        return session_id

    def who(self, headers: dict[str, str]) -> tuple[str, Role] | None:
        """The caller's token name and scope, from a bearer token or a session cookie;
        None for nobody (or a token revoked since)."""
        tokens = self.store.tokens()
        authorization = headers.get("authorization", "")
        if authorization.lower().startswith("bearer "):
            info = self.store.check(authorization[7:].strip())
            return (info.name, info.scope) if info is not None else None
        cookie = SimpleCookie(headers.get("cookie", ""))
        morsel = cookie.get(COOKIE)
        if morsel is None:
            return None
        session = self.sessions.get(morsel.value)
        now = time.monotonic()
        if session is None or now - session.last_seen > SESSION_IDLE_S:
            self.sessions.pop(morsel.value, None)
            return None
        if session.token not in tokens:
            return None
        session.last_seen = now
        return session.token, tokens[session.token].scope

    def refusal(self, path: str, method: str, headers: dict[str, str]) -> Exception | None:
        """Why the request may not pass (UnauthorizedError, ForbiddenError), or None."""
        if not self.store.enabled() or _is_open(path):
            return None
        caller = self.who(headers)
        if caller is None:
            return UnauthorizedError(
                "this service needs an API token: send `Authorization: Bearer TOKEN` "
                "(`kappaflow api token create`), or sign in on the dashboard"
            )
        name, scope = caller
        if _needs_admin(path, method) and scope is not Role.ADMIN:
            return ForbiddenError(f"token {name!r} has the scope {scope}; this needs admin")
        return None


def _is_open(path: str) -> bool:
    return path == "/" or path in OPEN or path.startswith(OPEN_PREFIXES)


def _needs_admin(path: str, _method: str) -> bool:
    return path.startswith("/v1/tokens")


class SignIn(BaseModel):
    token: str


class NewToken(BaseModel):
    name: str
    scope: Role = Role.READ


def add_auth(app: FastAPI, settings: Settings) -> None:
    """The door in front of every route, and the routes of sessions and tokens."""
    store = TokenStore(tokens_path(settings))
    door = Door(store)
    app.state.door = door
    # Pure ASGI: it guards WebSockets as well as HTTP, and streams pass through it.
    app.add_middleware(_Guard, door=door)

    @app.post("/v1/session", summary="Sign in with a token: a session cookie (the dashboard).")
    def sign_in(given: SignIn, request: Request) -> Response:
        info = store.check(given.token)
        if info is None:
            raise UnauthorizedError("that token is not one of this service's")
        answer = JSONResponse({"token": info.name, "scope": str(info.scope)})
        answer.set_cookie(
            COOKIE,
            door.open_session(info),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return answer

    @app.get("/v1/session", summary="Who this session is, and whether tokens are needed.")
    def session(request: Request) -> dict[str, Any]:
        caller = door.who(dict(request.headers))
        return {
            "tokens_required": store.enabled(),
            "token": caller[0] if caller else None,
            "scope": str(caller[1]) if caller else None,
        }

    @app.delete("/v1/session", summary="Sign out: the session ends.")
    def sign_out(request: Request) -> Response:
        cookie = request.cookies.get(COOKIE)
        if cookie is not None:
            door.sessions.pop(cookie, None)
        answer = JSONResponse({"signed_out": True})
        answer.delete_cookie(COOKIE, path="/")
        return answer

    @app.get("/v1/tokens", summary="The tokens (names and scopes, never the tokens).")
    def list_tokens() -> dict[str, Any]:
        return {"items": [t.public() for t in store.tokens().values()]}

    @app.post("/v1/tokens", summary="A new token, shown once (admin).", status_code=201)
    def create_token(given: NewToken) -> dict[str, Any]:
        token = store.create(given.name, given.scope)
        return {**store.tokens()[given.name].public(), "token": token}

    @app.delete("/v1/tokens/{name}", summary="Revoke a token (admin).")
    def revoke_token(name: str) -> dict[str, Any]:
        store.revoke(name)
        return {"revoked": name}


class _Guard:
    """ASGI middleware: refuses what the door refuses, as JSON (HTTP) or a close
    (WebSocket, before it is accepted: 4401 or 4403)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], door: Door):
        self.app = app
        self.door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self.door.refusal(scope["path"], scope.get("method", "GET"), headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status = 401 if isinstance(refusal, UnauthorizedError) else 403
        code = getattr(refusal, "code", "KF890")
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4000 + status, "reason": code})
            return
        answer = JSONResponse(
            {"code": code, "error": str(refusal)},
            status_code=status,
            headers={"WWW-Authenticate": "Bearer"} if status == 401 else None,
        )
        await answer(scope, receive, send)
