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

import contextlib
import fcntl
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.requests import cookie_parser

from kappaflow.errors import (
    ApiBadRequestError,
    DuplicateTokenError,
    ForbiddenError,
    KappaflowError,
    TokenFileError,
    UnauthorizedError,
    UnknownTokenError,
    http_status,
)
from kappaflow.settings import Settings
from kappaflow.timeutil import iso

TOKEN_PREFIX = "kf_"
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
COOKIE = "kf_session"
#: How long a dashboard session lasts without a request.
SESSION_IDLE_S = 8 * 3600
#: Paths anyone may reach: nothing in them is a job's.
OPEN = ("/v1/health", "/openapi.json", "/v1/session")
OPEN_PREFIXES = ("/dashboard",)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
#: A token's sessions beyond this many end, the oldest first.
SESSIONS_PER_TOKEN = 100

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
        self._seen: tuple[int, int, int] | None = None
        self._tokens: dict[str, TokenInfo] = {}
        #: The file exists and cannot be read: every request is refused until it can.
        self.broken: str | None = None

    def tokens(self) -> dict[str, TokenInfo]:
        """The tokens by name (none when the file does not exist)."""
        with self._lock:
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                self._seen, self._tokens, self.broken = None, {}, None
                return {}
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            if stamp != self._seen:
                try:
                    body = json.loads(self.path.read_text())
                    self._tokens = {
                        t["name"]: TokenInfo(
                            t["name"], Role(t["scope"]), t["created_at"], t["digest"]
                        )
                        for t in body.get("tokens", [])
                    }
                    self.broken = None
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    self._tokens, self.broken = {}, f"{self.path} cannot be read: {exc}"
                self._seen = stamp
            return dict(self._tokens)

    def enabled(self) -> bool:
        """Whether requests need a token: there are tokens, or a tokens file that cannot
        be read (which refuses everyone rather than no one)."""
        return bool(self.tokens()) or self.broken is not None

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
        if not _NAME.fullmatch(name):
            raise ApiBadRequestError(
                f"token name {name!r}: use 1 to 64 letters, digits, '.', '_' and '-'"
            )
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._writing() as tokens:
            if name in tokens:
                raise DuplicateTokenError(f"a token named {name!r} exists: revoke it first")
            tokens[name] = TokenInfo(name, scope, iso(datetime.now(UTC)), _digest(token))
        return token

    def revoke(self, name: str) -> None:
        with self._writing() as tokens:
            if name not in tokens:
                raise UnknownTokenError(f"no token named {name!r} (see `kappaflow api token list`)")
            del tokens[name]

    @contextlib.contextmanager
    def _writing(self) -> Iterator[dict[str, TokenInfo]]:
        """The tokens to change, under a lock every writer of the file takes (services
        and commands alike); saved, whole, when the block ends without an error."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f".{self.path.name}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            tokens = self.tokens()
            if self.broken is not None:
                raise TokenFileError(self.broken)
            yield tokens
            body = {"tokens": [{**asdict(t), "scope": str(t.scope)} for t in tokens.values()]}
            # Readable by its owner only from the start, then swapped in whole.
            fd, scratch = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w") as out:
                out.write(json.dumps(body, indent=2) + "\n")
                out.flush()
                os.fsync(out.fileno())
            Path(scratch).replace(self.path)


@dataclass
class Session:
    token: str  # the token's name
    #: The token's digest: a token revoked and made again under the same name does not
    #: bring its old sessions back.
    digest: str
    last_seen: float


class Caller(NamedTuple):
    token: str
    scope: Role
    #: Known by a session cookie (a browser), not by a bearer token.
    by_cookie: bool


class Door:
    """Who a request comes from, and whether it may have what it asks.

    ``open_without_tokens``: with no token, every request passes (a service on loopback);
    else, with none, every request but the open ones is refused (a service listening
    beyond loopback whose last token was revoked fails closed).
    """

    def __init__(self, store: TokenStore, *, open_without_tokens: bool = True) -> None:
        self.store = store
        self.open_without_tokens = open_without_tokens
        self.sessions: dict[str, Session] = {}

    def open_session(self, info: TokenInfo) -> str:
        now = time.monotonic()
        # Forget the sessions idle too long; keep each token's newest few.
        kept = [
            (sid, s)
            for sid, s in self.sessions.items()
            if now - s.last_seen <= SESSION_IDLE_S and s.token in self.store.tokens()
        ]
        mine = [sid for sid, s in kept if s.token == info.name]
        dropped = set(mine[: max(0, len(mine) - SESSIONS_PER_TOKEN + 1)])
        self.sessions = {sid: s for sid, s in kept if sid not in dropped}
        session_id = secrets.token_urlsafe(32)
        self.sessions[session_id] = Session(info.name, info.digest, now)
        return session_id

    def who(self, headers: dict[str, str]) -> Caller | None:
        """The caller, from a bearer token or a session cookie; None for nobody (or a
        token revoked since)."""
        tokens = self.store.tokens()
        authorization = headers.get("authorization", "")
        if authorization.lower().startswith("bearer "):
            info = self.store.check(authorization[7:].strip())
            return Caller(info.name, info.scope, False) if info is not None else None
        session_id = cookie_parser(headers.get("cookie", "")).get(COOKIE)
        if session_id is None:
            return None
        session = self.sessions.get(session_id)
        now = time.monotonic()
        if session is None or now - session.last_seen > SESSION_IDLE_S:
            self.sessions.pop(session_id, None)
            return None
        info = tokens.get(session.token)
        if info is None or not hmac.compare_digest(info.digest, session.digest):
            self.sessions.pop(session_id, None)
            return None
        session.last_seen = now
        return Caller(info.name, info.scope, True)

    def refusal(
        self, path: str, method: str, headers: dict[str, str], *, websocket: bool = False
    ) -> KappaflowError | None:
        """Why the request may not pass (UnauthorizedError, ForbiddenError), or None."""
        if _is_open(path):
            return None
        if not self.store.enabled():
            if self.open_without_tokens:
                return None
            return UnauthorizedError(
                "this service listens beyond loopback and has no API token left: create "
                "one (`kappaflow api token create NAME`)"
            )
        if self.store.broken is not None:
            return UnauthorizedError(f"the service's tokens cannot be read: {self.store.broken}")
        caller = self.who(headers)
        if caller is None:
            return UnauthorizedError(
                "this service needs an API token: send `Authorization: Bearer TOKEN` "
                "(`kappaflow api token create`), or sign in on the dashboard"
            )
        if caller.by_cookie and (websocket or method not in SAFE_METHODS):
            # A cookie goes with any page's request to this host: only the service's own
            # pages (the dashboard) may change things or open a socket with it.
            origin = headers.get("origin")
            if origin is None or urlsplit(origin).netloc != headers.get("host"):
                return ForbiddenError(
                    f"a request from {origin or 'an unknown page'} with the dashboard's "
                    "session: send it from the dashboard, or with a bearer token"
                )
        if _needs_admin(path) and caller.scope is not Role.ADMIN:
            return ForbiddenError(
                f"token {caller.token!r} has the scope {caller.scope}; this needs admin"
            )
        return None


def _is_open(path: str) -> bool:
    return (
        path == "/"
        or path in OPEN
        or any(path == prefix or path.startswith(prefix + "/") for prefix in OPEN_PREFIXES)
    )


def _needs_admin(path: str) -> bool:
    return path == "/v1/tokens" or path.startswith("/v1/tokens/")


class SignIn(BaseModel):
    token: str


class NewToken(BaseModel):
    name: str
    scope: Role = Role.READ


def add_auth(app: FastAPI, settings: Settings) -> None:
    """The door in front of every route, and the routes of sessions and tokens."""
    store = TokenStore(tokens_path(settings))
    door = Door(store, open_without_tokens=loopback_host(settings.api.host))
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
            "tokens_required": store.enabled() or not door.open_without_tokens,
            "token": caller.token if caller else None,
            "scope": str(caller.scope) if caller else None,
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
        # The path the routes see: a root path the service is mounted under is not theirs.
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        refusal = self.door.refusal(
            path,
            scope.get("method", "GET"),
            headers,
            websocket=scope["type"] == "websocket",
        )
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, code = http_status(refusal), refusal.code
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4000 + status, "reason": code})
            return
        answer = JSONResponse(
            {"code": code, "error": str(refusal)},
            status_code=status,
            headers={"WWW-Authenticate": "Bearer"} if status == 401 else None,
        )
        await answer(scope, receive, send)


def loopback_host(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
