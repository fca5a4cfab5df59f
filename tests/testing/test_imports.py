"""memkernel.testing needs hypothesis; plain ``import memkernel`` must not."""

from __future__ import annotations

import subprocess
import sys


def test_importing_memkernel_does_not_import_hypothesis():
    code = "import sys, memkernel; print('hypothesis' in sys.modules, 'memkernel.testing' in sys.modules)"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert shown.split() == ["False", "False"]
