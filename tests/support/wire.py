"""What crosses the loopback interface to and from one TCP port: the bytes a client and a
server exchange, captured from the kernel (a packet socket; root only)."""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

_ETH_P_ALL = 0x0003
_ETH_HEADER = 14
_IPV4 = 0x0800
_TCP = 6


@dataclass
class Capture:
    """TCP payloads seen to or from ``port``, in order, each as (to_port, bytes)."""

    port: int
    segments: list[tuple[bool, bytes]] = field(default_factory=list)

    @property
    def payload(self) -> bytes:
        return b"".join(data for _, data in self.segments)

    def first_to_server(self) -> bytes:
        return next((data for to_port, data in self.segments if to_port), b"")


def can_capture() -> bool:
    return hasattr(socket, "AF_PACKET") and os.geteuid() == 0


@contextmanager
def captured(port: int) -> Iterator[Capture]:
    """Capture the TCP payloads on loopback to or from ``port`` while the block runs."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(_ETH_P_ALL))
    sock.bind(("lo", 0))
    capture = Capture(port)
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            ready, _, _ = select.select([sock], [], [], 0.1)
            if not ready:
                continue
            frame, meta = sock.recvfrom(65_535)
            # Loopback shows every packet twice (outgoing and incoming): keep one copy.
            if meta[2] == socket.PACKET_OUTGOING:
                continue
            _record(capture, frame)

    reader = threading.Thread(target=read, name="wire-capture", daemon=True)
    reader.start()
    try:
        yield capture
    finally:
        done.set()
        reader.join(timeout=5)
        sock.close()


def _record(capture: Capture, frame: bytes) -> None:
    if len(frame) < _ETH_HEADER + 20:
        return
    (ethertype,) = struct.unpack("!H", frame[12:14])
    if ethertype != _IPV4:
        return
    ip = frame[_ETH_HEADER:]
    header = (ip[0] & 0x0F) * 4
    if ip[9] != _TCP:
        return
    (total,) = struct.unpack("!H", ip[2:4])
    tcp = ip[header:total]
    if len(tcp) < 20:
        return
    source, dest = struct.unpack("!HH", tcp[:4])
    if capture.port not in (source, dest):
        return
    data = tcp[(tcp[12] >> 4) * 4 :]
    if data:
        capture.segments.append((dest == capture.port, bytes(data)))
