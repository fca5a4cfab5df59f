"""Reading a file memkernel is given the path of (a manifest, a built shared object, an extern library, a
disk cache entry) without ever blocking: it is opened with ``O_NONBLOCK`` and checked with ``fstat``, so a
FIFO, a socket or a device is refused (:class:`NotRegularFile`), never waited on."""

from __future__ import annotations

import os
import stat

READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotRegularFile(OSError):
    """A path that is not a regular file, or is larger than the reader takes."""


def read_regular(path: str | os.PathLike[str], limit: int | None = None, *, folder: int | None = None,
                 follow: bool = True) -> bytes:
    """The bytes of the regular file at ``path`` (relative to the open ``folder``, if given); at most
    ``limit`` bytes. ``follow=False`` refuses a symbolic link. Raises NotRegularFile for a FIFO, a device, a
    directory or a larger file (its message says which: "it is a FIFO, not a regular file"), OSError if it
    cannot be opened or read; never blocks."""
    flags = READ_FLAGS if follow else READ_FLAGS | os.O_NOFOLLOW
    handle = os.open(path, flags, dir_fd=folder)
    try:
        status = os.fstat(handle)
        if not stat.S_ISREG(status.st_mode):
            kind = next((name for test, name in _KINDS if test(status.st_mode)), "not a regular file")
            raise NotRegularFile(f"it is {kind}, not a regular file")
        if limit is not None and status.st_size > limit:
            raise NotRegularFile(f"it has {status.st_size} bytes, more than {limit}")
        chunks: list[bytes] = []
        while True:  # the file may grow or shrink while it is read: read to its end
            chunk = os.read(handle, max(status.st_size, 1 << 16))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            if limit is not None and sum(map(len, chunks)) > limit:
                raise NotRegularFile(f"it has more than {limit} bytes")
    finally:
        os.close(handle)
