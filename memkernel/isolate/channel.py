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


def receive(sock: socket.socket) -> tuple[Any, list[int]]:
    """The next message and the descriptors sent with it; EOFError when the other end is gone."""
    header = bytearray()
    fds: list[int] = []
    while len(header) < _HEADER.size:
        data, more, _, _ = socket.recv_fds(sock, _HEADER.size - len(header), _MAX_FDS)
        if not data:
            raise EOFError("the other end of the channel closed it")
        header += data
        fds += more
    (size,) = _HEADER.unpack(header)
    body = bytearray(size)
    view = memoryview(body)
    received = 0
    while received < size:
        count = sock.recv_into(view[received:])
        if not count:
            raise EOFError("the other end of the channel closed it")
        received += count
    return pickle.loads(body), fds
