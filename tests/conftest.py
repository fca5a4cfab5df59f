"""Test session set-up: a disk cache of the session's own, so runs never share or touch the user's; no resident
compile server (``MEMKERNEL_COMPILE_SERVER_IDLE=0``: the many processes the tests start, each with a cache folder
of its own, would each leave one running; ``tests/compile/test_compile_server.py`` turns it on for its tests); and
Python's own Ctrl-C handler, which a shell's background job starts without (SIGINT ignored), so the tests
that send SIGINT see what a user's process has."""

from __future__ import annotations

import os
import signal
import tempfile

from hypothesis import HealthCheck, settings

_folder = tempfile.TemporaryDirectory(prefix="memkernel-test-cache-")
os.environ["MEMKERNEL_CACHE_DIR"] = _folder.name
os.environ["MEMKERNEL_COMPILE_SERVER_IDLE"] = "0"

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# A long fuzzing run: python -m pytest tests/test_fuzz.py --hypothesis-profile=memkernel-fuzz-long
settings.register_profile("memkernel-fuzz-long", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
