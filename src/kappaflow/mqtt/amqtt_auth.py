"""The amqtt broker's authentication plugin: every client on loopback is let in.

amqtt's own plugin for that, ``AnonymousAuthPlugin``, marks such clients anonymous, and
amqtt keeps no persistent session for an anonymous client: a bridge that reconnects
would find neither its subscription nor the messages queued while it was away. The
embedded broker listens on loopback only, as mosquitto's ``allow_anonymous`` does, so
every client counts as known. Loaded by the amqtt process alone (``amqtt`` is optional).
"""

from __future__ import annotations

from amqtt.plugins.base import BaseAuthPlugin
from amqtt.session import Session


class LoopbackAuthPlugin(BaseAuthPlugin):  # type: ignore[misc]
    async def authenticate(self, *, session: Session) -> bool:
        return True
