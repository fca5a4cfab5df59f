"""Helpers for the fast path's tests: they run whatever MEMKERNEL_FAST_PATH says for the session."""

from __future__ import annotations

import pytest

from memkernel import Kernel


def with_fast_path(kernel: Kernel, enabled: bool = True) -> Kernel:
    """``kernel`` compiled now with the fast path on (or off), whatever the environment says."""
    with pytest.MonkeyPatch.context() as patch:
        if enabled:
            patch.delenv("MEMKERNEL_FAST_PATH", raising=False)
        else:
            patch.setenv("MEMKERNEL_FAST_PATH", "0")
        return kernel.compile()
