"""Messages between a caller and its worker: length-prefixed pickles over a Unix socket, with descriptors.

A message may carry file descriptors (the shared-memory segment), sent with
its header as ``SCM_RIGHTS`` ancillary data; the receiver always reads a
header with room for them, so none is ever dropped.
"""

from __future__ import annotations

import pickle
import socket
import struct
from collections.abc import Sequence
from typing import Any

_HEADER = struct.Struct("<Q")
_MAX_FDS = 4
_SMALL = 1 << 16


def send(sock: socket.socket, message: Any, fds: Sequence[int] = ()) -> None:
    """Send ``message`` (pickled) and ``fds``."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    header = _HEADER.pack(len(payload))
    if fds:
        socket.send_fds(sock, [header], list(fds))
        sock.sendall(payload)
    elif len(payload) < _SMALL:
        sock.sendall(header + payload)
    else:
        sock.sendall(header)
        sock.sendall(payload)


def receive(sock: socket.socket, *, with_fds: bool = False) -> tuple[Any, list[int]]:
    """The next message and the descriptors sent with it (``with_fds``); EOFError when the other end is gone.

    The first read takes up to 64 KiB, so a small message costs one system call:
    the two ends take turns (one reply per request), so it never reads into a
    message that follows.
    """
    data = b""
    fds: list[int] = []
    while len(data) < _HEADER.size:
        if with_fds:
            more, received, _, _ = socket.recv_fds(sock, _SMALL, _MAX_FDS)
            fds += received
        else:
            more = sock.recv(_SMALL)
        if not more:
            raise EOFError("the other end of the channel closed it")
        data += more
    (size,) = _HEADER.unpack_from(data)
    end = _HEADER.size + size
    if len(data) >= end:
        return pickle.loads(memoryview(data)[_HEADER.size:end]), fds
    body = bytearray(size)
    received_bytes = len(data) - _HEADER.size
    body[:received_bytes] = memoryview(data)[_HEADER.size:]
    view = memoryview(body)
    while received_bytes < size:
        count = sock.recv_into(view[received_bytes:])
        if not count:
            raise EOFError("the other end of the channel closed it")
        received_bytes += count
    return pickle.loads(body), fds
