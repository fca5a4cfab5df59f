"""Test session set-up: a disk cache of the session's own, so runs never share or touch the user's."""

from __future__ import annotations

import os
import tempfile

_folder = tempfile.TemporaryDirectory(prefix="memkernel-test-cache-")
os.environ["MEMKERNEL_CACHE_DIR"] = _folder.name
