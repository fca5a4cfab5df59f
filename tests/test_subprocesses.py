"""Starting memkernel's worker processes: a worker runs memkernel's code, never what the caller's folder holds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from .processes import REPO


def run(script: str, cwd, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MEMKERNEL_CACHE_DIR": ""}
    return subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=env)


def test_workers_never_import_from_the_callers_folder(tmp_path):
    """A numpy.py in the folder a user starts from must not run in memkernel's worker processes."""
    planted = tmp_path / "untrusted"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "numpy.py").write_text(f"open({str(marker)!r}, 'a').write('ran')\nraise ImportError('planted')\n")
    script = tmp_path / "victim.py"
    script.write_text(textwrap.dedent("""
        from memkernel import mlir_kernel
        k = mlir_kernel("func.func @q(%x: i64) -> i64 { return %x : i64 }", cache=False)(lambda x: None)
        i = mlir_kernel("func.func @r(%x: i64) -> i64 { return %x : i64 }", isolate=True)(lambda x: None)
        print(k(3), i(4))
    """))
    done = run(str(script), cwd=planted)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "4"]
    assert not marker.exists()
