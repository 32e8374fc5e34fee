"""One call to a JSON REST API that kappaflow runs beside Kafka (Kafka Connect, the schema
registry): the request, and the service's own words when it refuses."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


class RefusedError(Exception):
    """The service answered with an HTTP error: its status and its ``message``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message


def call(
    url: str,
    method: str,
    body: object = None,
    *,
    content_type: str = "application/json",
    timeout: float = 30.0,
) -> bytes:
    """The answer's bytes to ``method url`` with ``body`` as JSON. RefusedError when the service
    refuses (with the ``message`` of its JSON error, else the HTTP reason); OSError when it
    does not answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            raw: bytes = response.read()
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("message", exc.reason)
        except ValueError:
            message = exc.reason
        raise RefusedError(exc.code, str(message)) from None
    return raw
