"""A service's port: refused while held, waited for while held a moment."""

from __future__ import annotations

import socket
import threading

from kappaflow.procs import port_held, port_in_use


def _holding() -> tuple[socket.socket, int]:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder, holder.getsockname()[1]


def test_a_port_held_past_the_grace_is_held() -> None:
    holder, port = _holding()
    with holder:
        assert port_in_use("127.0.0.1", port)
        assert port_held("127.0.0.1", port, grace=0.5)


def test_a_port_held_a_moment_is_waited_for() -> None:
    holder, port = _holding()
    releaser = threading.Timer(0.5, holder.close)
    releaser.start()
    try:
        assert not port_held("127.0.0.1", port, grace=10.0)
        assert not port_in_use("127.0.0.1", port)
    finally:
        releaser.cancel()
        holder.close()
