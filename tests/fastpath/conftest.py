"""Helpers for the fast path's tests: they run whatever MEMKERNEL_FAST_PATH says for the session."""

from __future__ import annotations

import pytest

from memkernel import Kernel
from memkernel.fastpath.abi import has_c_function

HAS_ENTRIES = has_c_function("PyObject_Vectorcall")
"""Compiled entries pass declined calls on with PyObject_Vectorcall, an export from Python 3.11 on."""


def with_fast_path(kernel: Kernel, enabled: bool = True) -> Kernel:
    """``kernel`` compiled now with the fast path on (or off), whatever the environment says."""
    with pytest.MonkeyPatch.context() as patch:
        if enabled:
            patch.delenv("MEMKERNEL_FAST_PATH", raising=False)
        else:
            patch.setenv("MEMKERNEL_FAST_PATH", "0")
        return kernel.compile()
