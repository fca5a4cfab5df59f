"""The README's example runs as written, and its set-up block holds exactly the two commands CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_the_quickstart_example_runs_and_matches_numpy():
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    np.testing.assert_array_equal(namespace["c"], np.ones((4, 3), np.float32) @ np.ones((3, 5), np.float32))


def test_the_setup_block_has_the_two_commands():
    block = README.split("<!-- setup -->", 1)[1].split("```", 2)[1]
    commands = [line for line in block.splitlines()[1:] if line.strip()]
    assert len(commands) == 2
    assert "python -m memkernel" in commands[0] and "pip install ." in commands[0]
    assert "'.[test]'" in commands[1] and "python -m pytest" in commands[1]
