"""memkernel's pytest plugin: options for a test session, kernels named in failures, MLIR test files as tests.

Installed memkernel registers it (the ``pytest11`` entry point ``memkernel``); in a
checkout, ``pytest -p memkernel.pytest_plugin`` loads it.

``--memkernel-checked``
    Sets ``MEMKERNEL_CHECKED=1`` for the session: kernels compile with runtime
    verification (out-of-bounds accesses, inconsistent linalg shapes) unless they say otherwise.
``--memkernel-isolate``
    Sets ``MEMKERNEL_ISOLATE=1``: kernel calls run in a worker process, so a crashing
    kernel fails its test instead of ending the session.
``--memkernel-mlir=DIR`` (repeatable; or the ini option ``memkernel_mlir``)
    Collects the ``.mlir`` files under DIR whose ``// RUN:`` lines run an entry point
    (``mlir-runner``, ``mlir-cpu-runner`` or ``memkernel run``): one test per such RUN
    line, which compiles the file with memkernel, calls the entry as ``mlir-runner``
    does (``-e``, ``-entry-point-result``, ``-shared-libs``, ``-O``, and LLVM's own options
    such as ``-enable-matrix``; ``--pipeline`` and ``--schedule`` of a ``memkernel run`` line) and checks
    what it prints against the file's ``CHECK`` lines (the RUN line's ``FileCheck --check-prefix(es)``)
    with the ``filecheck`` package. The ``mlir-opt`` part of a RUN line is not run: memkernel's own
    pipeline lowers the file, and applies a transform schedule it carries when that part runs the
    transform interpreter (after bufferization if it comes after ``-one-shot-bufferize``). A runner
    under lit's ``not`` (``not mlir-runner ...``) is expected to stop at a failed ``cf.assert``, whose
    message it prints as ``memkernel run`` does; with ``2>&1`` what it prints on stderr is checked too.

When a test fails with a :class:`~memkernel.errors.MemkernelError`, its report gets a
``memkernel`` section naming the kernel and the line it was decorated at.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import linecache
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from .errors import KernelAssertionError, MemkernelError

_ENVIRONMENT = {"memkernel_checked": "MEMKERNEL_CHECKED", "memkernel_isolate": "MEMKERNEL_ISOLATE"}
_SAVED = pytest.StashKey[dict[str, "str | None"]]()
_MLIR_DIRS = pytest.StashKey[list[Path]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memkernel")
    group.addoption("--memkernel-checked", action="store_true", default=False,
                    help="compile kernels with runtime verification (sets MEMKERNEL_CHECKED=1)")
    group.addoption("--memkernel-isolate", action="store_true", default=False,
                    help="run kernel calls in a worker process (sets MEMKERNEL_ISOLATE=1)")
    group.addoption("--memkernel-mlir", action="append", default=[], metavar="DIR",
                    help="collect the .mlir files under DIR whose RUN lines run an entry point, "
                         "and check their output against their CHECK lines")
    parser.addini("memkernel_mlir", type="paths", default=[],
                  help="folders of .mlir test files to collect, as --memkernel-mlir")


def pytest_configure(config: pytest.Config) -> None:
    saved: dict[str, str | None] = {}
    for option, variable in _ENVIRONMENT.items():
        if config.getoption(option):
            saved[variable] = os.environ.get(variable)
            os.environ[variable] = "1"
    config.stash[_SAVED] = saved
    folders = [Path(d).resolve() for d in config.getoption("memkernel_mlir")]
    folders += [Path(d).resolve() for d in config.getini("memkernel_mlir")]
    config.stash[_MLIR_DIRS] = folders
    arguments = [Path(a.split("::")[0]).resolve() for a in config.args]
    for folder in folders:  # a folder outside every path pytest collects from is collected too
        if not any(folder.is_relative_to(a) for a in arguments):
            config.args.append(str(folder))


def pytest_unconfigure(config: pytest.Config) -> None:
    for variable, value in config.stash.get(_SAVED, {}).items():
        if value is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = value


# -- failures that name the kernel -----------------------------------------------------


def _frames(tb: TracebackType | None) -> Iterator[Any]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _site(filename: str, line: int) -> str:
    text = linecache.getline(filename, line).strip()
    return f"{filename}:{line}" + (f": {text}" if text else "")


def kernel_section(error: BaseException) -> str | None:
    """What the ``memkernel`` section of a failure report says: the kernel the error came from and
    where it was decorated (for an error at decoration, where that happened); None if no kernel is in
    the traceback."""
    from .kernel import Kernel

    frames = list(_frames(error.__traceback__))
    for frame in reversed(frames):
        kernel = frame.f_locals.get("self")
        site = getattr(kernel, "decorated_at", None) if isinstance(kernel, Kernel) else None
        if site is not None:
            return f"kernel @{kernel.__name__}, decorated at {_site(*site)}"
    package = str(Path(__file__).parent)
    for outer, inner in zip(frames, frames[1:]):
        if not outer.f_code.co_filename.startswith(package) and inner.f_code.co_filename.startswith(package) \
                and inner.f_code.co_name == "decorate":
            return f"decorating a kernel at {_site(outer.f_code.co_filename, outer.f_lineno)}"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    error = call.excinfo.value if call.excinfo is not None else None
    if isinstance(error, MemkernelError):
        section = kernel_section(error)
        if section is not None:
            report.sections.append(("memkernel", section))
    return report


# -- MLIR test files ------------------------------------------------------------------------

_DIRECTIVE = re.compile(r"^\s*//\s*(RUN|DEFINE):\s?(.*)$")
_DEFINITION = re.compile(r"\s*(%\{[\w.-]+\})\s*=(.*)")
_RUNNERS = ("mlir-runner", "mlir-cpu-runner")
_LIBRARY = re.compile(r"%mlir_lib_dir/lib(\w+)%shlibext|%(mlir_\w+)")


@dataclass(frozen=True)
class RunLine:
    """What one RUN line of an MLIR test file asks: the entry to call and how, and the check prefixes."""

    line: int
    entry: str = "main"
    result: str = "void"
    shared_libs: tuple[str, ...] = ()
    opt_level: int = 3
    pipeline: str | None = None
    check_prefixes: tuple[str, ...] | None = None
    llvm_options: tuple[str, ...] = ()
    schedule: str | None = None
    fails: bool = False
    """The runner runs under ``not``: the entry is expected to stop at a failed ``cf.assert``."""
    merges_stderr: bool = False
    """The runner's stderr goes into what is checked (``2>&1``)."""


def _directives(text: str) -> Iterator[tuple[int, str, str]]:
    """Each RUN or DEFINE directive of ``text``: its first line number, kind and text, continuation
    lines (``\\``) joined."""
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        found = _DIRECTIVE.match(line)
        if found is None:
            continue
        part = found.group(2).rstrip()
        start = start or number
        if part.endswith("\\"):
            pending += part[:-1] + " "
            continue
        yield start, found.group(1), pending + part
        pending, start = "", 0


def _commands(text: str) -> Iterator[tuple[int, str]]:
    """Each RUN command of ``text`` with its line number, lit's ``%{name}`` of DEFINE lines substituted."""
    defined: dict[str, str] = {}
    for line, kind, command in _directives(text):
        definition = _DEFINITION.fullmatch(command) if kind == "DEFINE" else None
        if definition is not None:
            defined[definition.group(1)] = definition.group(2).strip()
            continue
        for _ in range(len(defined) + 1):  # definitions may use earlier ones
            for name, value in defined.items():
                command = command.replace(name, value)
        yield line, command


def _library(name: str) -> str:
    """A lit substitution for an MLIR runtime library (``%mlir_c_runner_utils``) as the name memkernel finds."""
    found = _LIBRARY.fullmatch(name)
    return (found.group(1) or found.group(2)) if found else name


def _option(words: list[str], i: int, *names: str) -> tuple[str, int] | None:
    """The value of option ``names`` at ``words[i]`` (``-x=v``, ``-x v`` or ``-Xv`` for ``-O``) and the next index."""
    word = words[i]
    for name in names:
        for dashes in ("-", "--"):
            flag = dashes + name
            if word.startswith(flag + "="):
                return word[len(flag) + 1:], i + 1
            if word == flag and i + 1 < len(words):
                return words[i + 1], i + 2
    return None


_TARGET_OPTIONS = re.compile(r"--?(march|mattr|mcpu|dump-object-file|object-filename)(=.*)?")
"""Options of mlir-runner that memkernel does without: it compiles for the host CPU, in memory."""


def _runner_options(words: list[str], line: int) -> tuple[RunLine, list[str]]:
    """The entry, result, libraries, level, pipeline and schedule of a runner's options, and the words that
    are no option (the file it reads); its other options that start with a dash are LLVM's
    (``-enable-matrix``), but for the target's, which are dropped."""
    entry, result, libs, opt, pipeline, llvm, schedule = "main", "void", [], 3, None, [], None
    positional = []
    i = 1
    while i < len(words):
        if re.fullmatch(r"-O[0-3]", words[i]):
            opt, i = int(words[i][2]), i + 1
            continue
        for names in (("e",), ("entry-point-result",), ("shared-libs",), ("pipeline",), ("llvm-option",),
                      ("schedule",)):
            found = _option(words, i, *names)
            if found is not None:
                value, i = found
                if names == ("e",):
                    entry = value
                elif names == ("entry-point-result",):
                    result = value
                elif names == ("shared-libs",):
                    libs += [_library(lib) for lib in value.split(",") if lib]
                elif names == ("pipeline",):
                    pipeline = value
                elif names == ("schedule",):
                    schedule = value
                else:
                    llvm.append(value)
                break
        else:
            if not words[i].startswith("-"):
                positional.append(words[i])
            elif not _TARGET_OPTIONS.fullmatch(words[i]):
                llvm.append(words[i])
            i += 1
    return RunLine(line, entry, result, tuple(libs), opt, pipeline, None, tuple(llvm), schedule), positional


def _check_prefixes(words: list[str]) -> tuple[str, ...]:
    prefixes: list[str] = []
    for i in range(1, len(words)):
        found = _option(words, i, "check-prefix", "check-prefixes")
        if found is not None:
            prefixes += found[0].split(",")
    return tuple(prefixes) or ("CHECK",)


def _without_not(stage: list[str]) -> tuple[list[str], bool]:
    """A pipeline stage without lit's ``not`` (and its ``--crash``) in front, and whether it had one."""
    if not stage or stage[0] != "not":
        return stage, False
    rest = stage[1:]
    while rest and rest[0].startswith("-"):
        rest = rest[1:]
    return rest, True


def _is_runner(stage: list[str]) -> bool:
    return bool(stage) and (stage[0] in _RUNNERS or stage[:2] == ["memkernel", "run"])


def _opt_schedule(stages: list[list[str]]) -> str:
    """Where the ``mlir-opt`` stages that lowered a runner's input apply the file's transform schedule, as
    ``memkernel run --schedule`` says it: ``"skip"`` unless one runs the transform interpreter,
    ``"after-bufferization"`` when it runs it after ``one-shot-bufferize``, else ``"before-bufferization"``."""
    from .compile.pipeline import runs_transform_interpreter

    opt = " ".join(" ".join(s) for s in stages if s and s[0] == "mlir-opt")
    if not runs_transform_interpreter(opt):
        return "skip"
    bufferize = opt.find("one-shot-bufferize")
    return "after-bufferization" if 0 <= bufferize < opt.find("interpreter") else "before-bufferization"


def _writes(stages: list[list[str]], path: str) -> bool:
    """Whether a command's stages write ``path`` (``-o PATH``, ``-o=PATH``, ``> PATH``, ``>PATH``)."""
    words = [w for stage in stages for w in stage]
    return any(w in (f"-o={path}", f">{path}") or (w in ("-o", ">") and words[k + 1:k + 2] == [path])
               for k, w in enumerate(words))


def _lowered_by(stages: list[list[str]], at: int, inputs: list[str], earlier: list[list[list[str]]]) -> str | None:
    """The ``--schedule`` of the runner at ``stages[at]``, which reads ``inputs``, from the ``mlir-opt``
    stages that lowered what it reads: those piped into it, or those of the earlier command that wrote
    the file it reads (``%t``); None when no command says (a file made elsewhere)."""
    if not inputs:
        return _opt_schedule(stages[:at])
    if inputs[0] == "%s":
        return "skip"  # the runner reads the file as it is
    writer = next((c for c in reversed(earlier) if _writes(c, inputs[0])), None)
    return _opt_schedule(writer) if writer is not None else None


def run_lines(text: str) -> list[RunLine]:
    """The RUN lines of an MLIR test file that call an entry point, as :class:`RunLine` s.

    A ``mlir-runner`` line runs what ``mlir-opt`` lowered, piped in or written by an earlier line, or an
    earlier command of its line (``-o %t && mlir-runner %t``): the file's transform schedule is applied only if that ``mlir-opt`` runs the
    transform interpreter. Under lit's ``not`` the entry is expected to fail; with ``2>&1`` its
    stderr is checked too."""
    found: list[RunLine] = []
    earlier: list[list[list[str]]] = []
    for line, command in ((line, part) for line, whole in _commands(text) for part in whole.split("&&")):
        stages = [shlex.split(stage) for stage in command.split("|")]
        earlier.append(stages)
        at = next((k for k, stage in enumerate(stages) if _is_runner(_without_not(stage)[0])), None)
        if at is None:
            continue
        runner, fails = _without_not(stages[at])
        words = [w for w in (runner[1:] if runner[0] == "memkernel" else runner) if w != "2>&1"]
        run, inputs = _runner_options(words, line)
        if runner[0] in _RUNNERS:
            run = dataclasses.replace(run, schedule=_lowered_by(stages, at, inputs, earlier[:-1]))
        checker = next((s for s in stages if s and s[0] in ("FileCheck", "filecheck")), None)
        prefixes = _check_prefixes(checker) if checker is not None else None
        found.append(dataclasses.replace(run, check_prefixes=prefixes, fails=fails, merges_stderr="2>&1" in runner))
    return found


class MlirCheckFailure(Exception):
    """The output of an MLIR test file's entry did not pass its CHECK lines."""


def run_entry(path: Path, run: RunLine) -> tuple[str, KernelAssertionError | None]:
    """What ``memkernel run`` prints for ``run``'s entry of the file at ``path`` (on stdout, and on stderr
    too for a ``2>&1`` line), and the failed assertion that stopped the entry, if one did."""
    from .cli import call_entry, error_line, runner_kernel

    kernel = runner_kernel(path.read_text(), str(path), run.entry, run.result, pipeline=run.pipeline,
                           opt_level=run.opt_level, shared_libs=run.shared_libs, llvm_options=run.llvm_options,
                           schedule=run.schedule)
    printed = io.StringIO()
    with contextlib.ExitStack() as redirected:
        redirected.enter_context(contextlib.redirect_stdout(printed))
        if run.merges_stderr:
            redirected.enter_context(contextlib.redirect_stderr(printed))
        failed = call_entry(kernel, run.result)
        if failed is not None and run.merges_stderr:
            print(error_line(failed), file=sys.stderr)
    return printed.getvalue(), failed


def check_output(path: Path, output: str, prefixes: tuple[str, ...]) -> None:
    """Check ``output`` against the CHECK lines of ``path`` with the ``filecheck`` package; MlirCheckFailure
    with its report if it does not pass."""
    command = [sys.executable, "-m", "filecheck", str(path), f"--check-prefixes={','.join(prefixes)}"]
    checked = subprocess.run(command, input=output, capture_output=True, text=True)
    if checked.returncode != 0:
        raise MlirCheckFailure(f"{checked.stdout}{checked.stderr}".strip() + f"\n\nThe output was:\n{output}")


class MlirFile(pytest.File):
    """An MLIR test file: one :class:`MlirItem` per RUN line that calls an entry point."""

    def collect(self) -> Iterator[MlirItem]:
        runs = run_lines(self.path.read_text())
        entries = [run.entry for run in runs]
        for run in runs:
            name = run.entry if entries.count(run.entry) == 1 else f"{run.entry}:line{run.line}"
            yield MlirItem.from_parent(self, name=name, run=run)


class MlirItem(pytest.Item):
    """One RUN line of an MLIR test file: its entry, run and checked."""

    def __init__(self, *, run: RunLine, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run = run

    def runtest(self) -> None:
        output, failed = run_entry(self.path, self.run)
        if failed is not None and not self.run.fails:
            raise failed
        if failed is None and self.run.fails:
            raise MlirCheckFailure(f"the RUN line runs the entry under `not`, but it returned instead of stopping "
                                   f"at a failed cf.assert.\n\nThe output was:\n{output}")
        if self.run.check_prefixes is not None:
            check_output(self.path, output, self.run.check_prefixes)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str | Any:
        if isinstance(excinfo.value, MlirCheckFailure):
            return f"{self.path.name}, RUN line {self.run.line} (@{self.run.entry}):\n{excinfo.value}"
        if isinstance(excinfo.value, MemkernelError):
            return f"{self.path.name}, RUN line {self.run.line} (@{self.run.entry}): {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.run.line - 1, self.name


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> MlirFile | None:
    if file_path.suffix != ".mlir":
        return None
    folders = parent.config.stash.get(_MLIR_DIRS, [])
    if not any(file_path.resolve().is_relative_to(folder) for folder in folders):
        return None
    if not run_lines(file_path.read_text()):
        return None
    return MlirFile.from_parent(parent, path=file_path)
