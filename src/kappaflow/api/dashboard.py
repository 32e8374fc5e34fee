"""The live web dashboard: static files the service serves at ``/dashboard/``.

The page (``static/``: HTML, CSS and ES modules, no build step) reads the service's own
JSON endpoints and its Server-Sent Events, from the same origin only: its responses carry
a Content-Security-Policy that allows nothing from elsewhere, no inline script and no
framing. ``GET /`` redirects to it.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC = Path(__file__).resolve().parent / "static"
PATH = "/dashboard"

#: Everything from the service itself; SVG charts are drawn through the DOM, so no
#: inline script or style is needed.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    # The page and its modules change with the package: a reload gets the new ones.
    "cache-control": "no-cache",
}


class _WithHeaders:
    """``app`` whose HTTP responses carry ``SECURITY_HEADERS``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.decode("latin-1").lower() not in SECURITY_HEADERS
                ]
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def add_dashboard(app: FastAPI) -> None:
    """Serve the dashboard at ``/dashboard/`` and send ``/`` there."""

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse(f"{PATH}/", status_code=307)

    @app.get(PATH, include_in_schema=False)
    def dashboard_slash() -> RedirectResponse:
        return RedirectResponse(f"{PATH}/", status_code=307)

    app.mount(PATH, _WithHeaders(StaticFiles(directory=STATIC, html=True)), name="dashboard")
