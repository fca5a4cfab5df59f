"""The ``memkernel`` command line: look at, call and time the functions of an MLIR file.

``memkernel info FILE.mlir``
    Each function with a body: its arguments (name, MLIR type, numpy dtype,
    shape pattern, tied dims, whether the kernel may write it) and results.
``memkernel call FILE.mlir FUNC --arg NAME=PATH.npy ... [--scalar NAME=VALUE ...] [--out DIR]``
    Calls a function on ``.npy`` inputs and writes its outputs and results
    as ``.npy`` files in DIR.
``memkernel bench FILE.mlir FUNC --shape NAME=NxM ... [--scalar NAME=VALUE ...]``
    Times calls on random inputs and splits the time into wrapper overhead
    and kernel time, with GB/s and, for linalg ops, GFLOP/s.
``memkernel run FILE.mlir [-e main] [-entry-point-result=void|i32|i64|f32] [-shared-libs=...] [-O3] ...``
    Runs an MLIR test file's entry point as ``mlir-runner`` does and prints what
    it prints (see :func:`add_run_command`); ``-`` reads standard input. A failed
    ``cf.assert`` prints its message, as MLIR's lowering of it does, and exits with status 1.

Arguments are named as in the MLIR source (``%a`` is ``a``; a keyword,
``out`` or ``result<j>`` gets a ``_``; a name that is not a Python identifier
becomes ``arg<i>``, see :func:`argument_names`). The convention is the one of a
decorated function: the arguments you give (``--arg``, ``--scalar``,
``--shape``) are the leading MLIR arguments and are passed as they are, in
place (what the kernel writes into them is written back and saved); the
trailing memref arguments you leave out are outputs the call allocates.

Errors print one line, ``memkernel: error: ...`` (MLIR's diagnostics follow
a syntax error), and exit with status 1; ``--traceback`` shows the traceback.
"""

from __future__ import annotations

import argparse
import cmath
import contextlib
import itertools
import keyword
import math
import os
import stat
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import numpy as np
import numpy.lib.format as npy_format
from mlir import ir, passmanager

from . import display
from .analysis.shapes import argument_of, structured_names, unconditional
from .analysis.source import MLIR_LOCK, ParsedSource, parse_source
from .analysis.types import read_signature
from .errors import KernelAssertionError, MemkernelError
from .kernel import Kernel, mlir_kernel, named_parameters
from .model.shapes import Dim
from .model.signature import ArgSpec, MemRefSpec, ScalarSpec, Signature, UnrankedSpec
from .options import SCHEDULES


class CommandLineError(MemkernelError, ValueError):
    """A command-line argument memkernel cannot use: a file it cannot read, an argument name the
    function does not have, a value that does not parse."""


# -- reading the file ----------------------------------------------------------------


def read_source(path: str) -> ParsedSource:
    """The parsed MLIR file; CommandLineError if it cannot be read, MLIRSyntaxError if it does not parse."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CommandLineError(f"cannot read {path}: {reason}") from None
    return parse_source(text)


_LOCATION = re.compile(r'loc\("[^"]*":(\d+):(\d+)\)')
_SSA_NAME = re.compile(r"%([A-Za-z_$.\-][\w$.\-]*|\d+)")


def is_memref(spec: ArgSpec) -> bool:
    """A memref argument (not a scalar, not a tensor): the kinds a call may allocate and a kernel may write."""
    return isinstance(spec, (MemRefSpec, UnrankedSpec)) and not spec.tensor


def check_function(parsed: ParsedSource, path: str, function: str) -> str:
    """``function`` without its ``@``; CommandLineError, listing the functions ``path`` defines, if it is not one."""
    function = function.removeprefix("@")
    with MLIR_LOCK, parsed.context:
        defined = parsed.defined_names()
    if function not in defined:
        listed = ", ".join(defined) or "none"
        raise CommandLineError(f"{path} defines no func.func @{function} with a body; it defines: {listed}")
    return function


_RESERVED = re.compile(r"out|result\d+")
"""Names an argument cannot have: ``out=`` of a call, and the results' ``result0``, ``result1``, ..."""


def _source_names(parsed: ParsedSource, function: str) -> list[str]:
    """The SSA name of each of ``@function``'s arguments as the source spells it (``a`` for ``%a``), or ``""``."""
    lines = parsed.text.splitlines()
    with MLIR_LOCK, parsed.context:
        locations = [str(a.location) for a in parsed.function(function).regions[0].blocks[0].arguments]
    names = []
    for location in locations:
        found = _LOCATION.fullmatch(location)
        name = ""
        if found:
            line, column = int(found.group(1)), int(found.group(2))
            text = lines[line - 1].encode()[column - 1:].decode(errors="replace") if line <= len(lines) else ""
            ssa = _SSA_NAME.match(text)
            name = ssa.group(1) if ssa else ""
        names.append(name)
    return names


def _wanted(name: str) -> tuple[int, str | None]:
    """The Python name an SSA name asks for, and its rank: 0 as spelled, 1 with a ``_`` added, 2 none."""
    if keyword.iskeyword(name) or _RESERVED.fullmatch(name):
        return 1, f"{name}_"
    return (0, name) if name.isidentifier() else (2, None)


def argument_names(parsed: ParsedSource, function: str) -> list[str]:
    """The Python names of ``@function``'s arguments, all different and none a result's: ``%a`` is ``a``;
    a keyword, ``out`` or ``result<j>`` gets a ``_`` (``%in`` is ``in_``); a name that is no identifier
    (``%0``, ``%x.y``), or that an argument spelled so has, is ``arg<i>``, with ``_`` added until no other
    argument has it."""
    wanted = [_wanted(name) for name in _source_names(parsed, function)]
    names: dict[int, str] = {}
    for rank in (0, 1):  # names as spelled first, so that %in_ keeps in_ and %in becomes arg<i>
        for i, (r, name) in enumerate(wanted):
            if r == rank and name is not None and name not in names.values():
                names[i] = name
    for i in range(len(wanted)):
        if i not in names:
            name = f"arg{i}"
            while name in names.values():
                name += "_"
            names[i] = name
    return [names[i] for i in range(len(wanted))]


def make_kernel(source: str, function: str, parameters: Sequence[str], pipeline: str | None = None,
                opt_level: int = 3, shared_libs: Sequence[str] = (), schedule: str | None = None) -> Kernel:
    """``@function`` as a kernel whose Python parameters are ``parameters`` (the leading MLIR arguments);
    the shapes of outputs come from the inputs and the kernel's ties."""
    return mlir_kernel(source, name=function, pipeline=pipeline, opt_level=opt_level, shared_libs=shared_libs,
                       schedule=schedule)(named_parameters(function, parameters))


# -- info ------------------------------------------------------------------------------


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _first_output(kernel: Kernel) -> int:
    """Where the trailing run of memref arguments the kernel writes starts: those may be outputs."""
    spec = kernel.spec
    first = len(spec.signature.args)
    while first > 0 and first - 1 in spec.written and is_memref(spec.signature.args[first - 1]):
        first -= 1
    return first


def _call_forms(kernel: Kernel, names: Sequence[str]) -> list[str]:
    """``f(a, b, c)`` with every argument, and ``c = f(a, b)`` when trailing memrefs may be outputs."""
    spec = kernel.spec
    first = _first_output(kernel)
    returned = list(names[first:]) + [f"result{j}" for j in range(len(spec.signature.results))]
    forms = [f"{spec.name}({', '.join(names)})"]
    if returned:
        forms.append(f"{', '.join(returned)} = {spec.name}({', '.join(names[:first])})")
    return forms


def describe(kernel: Kernel, names: Sequence[str]) -> list[str]:
    """The lines ``memkernel info`` prints for one kernel whose parameters name every argument."""
    spec = kernel.spec
    labels = display.dim_labels(spec)
    rows = [["argument", "MLIR type", "dtype", "shape", "kernel", "tied to"]]
    for i, arg in enumerate(spec.signature.args):
        if isinstance(arg, ScalarSpec):
            access = "scalar"
        else:
            access = "writes" if i in spec.written else "reads"
        rows.append([names[i], arg.mlir, str(arg.element.dtype), display.shape_text(spec, i, labels), access,
                     "; ".join(display.tied_to(spec, i))])
    for j, result in enumerate(spec.signature.results):
        rows.append([f"result{j}", result.mlir, str(result.element.dtype), "", "returns", ""])
    forms = _call_forms(kernel, names)
    lines = [f"@{spec.name}", f"  call:  {forms[0]}"]
    lines += [f"     or: {form}   (memkernel allocates the outputs)" for form in forms[1:]]
    return lines + _columns(rows)


def run_info(options: argparse.Namespace) -> int:
    parsed = read_source(options.file)
    with MLIR_LOCK, parsed.context:
        functions = parsed.defined_names()
    if not functions:
        raise CommandLineError(f"{options.file} defines no func.func with a body")
    print(f"{options.file}: {len(functions)} function(s). Arguments are passed in place; trailing memrefs the "
          "kernel writes may instead be left out and allocated.")
    for function in functions:
        print()
        try:
            names = argument_names(parsed, function)
            print("\n".join(describe(make_kernel(parsed.text, function, names), names)))
        except MemkernelError as exc:
            print(f"@{function}\n  cannot be called from Python: {exc}")
    return 0


# -- arguments shared by call and bench ------------------------------------------------------


def _pairs(entries: Sequence[str], option: str, value: str, names: Sequence[str]) -> dict[str, str]:
    """``NAME=VALUE`` entries by argument name; the MLIR spelling (``%in``, ``in``) names ``in_`` too."""
    pairs: dict[str, str] = {}
    for entry in entries:
        name, equals, text = entry.partition("=")
        name = name.removeprefix("%")
        if name not in names and f"{name}_" in names:
            name += "_"
        if not equals or not name:
            raise CommandLineError(f"{option} expects NAME={value}, got {entry!r}")
        if name in pairs:
            raise CommandLineError(f"{option} {name} is given twice")
        pairs[name] = text
    return pairs


@dataclass
class Plan:
    """Which MLIR arguments a command gives (the leading ones) and which the call allocates."""

    function: str
    names: list[str]
    args: tuple[ArgSpec, ...]
    n_given: int

    @property
    def given(self) -> list[str]:
        return self.names[:self.n_given]

    @property
    def outputs(self) -> list[str]:
        return self.names[self.n_given:]


def plan_arguments(parsed: ParsedSource, function: str, names: list[str], given: Sequence[str], option: str) -> Plan:
    """Check that the names ``given`` are the leading arguments of ``@function`` and the others trailing memrefs."""
    with MLIR_LOCK, parsed.context:
        args = read_signature(parsed.function(function)).args
    listed = ", ".join(f"{n} ({a.mlir})" for n, a in zip(names, args)) or "none"
    for name in given:
        if name not in names:
            raise CommandLineError(f"@{function} has no argument {name!r}; its arguments: {listed}")
    n_given = max((names.index(n) + 1 for n in given), default=0)
    for i in range(len(args)):
        needed = i < n_given or not is_memref(args[i])
        if names[i] not in given and needed:
            what = "--scalar NAME=VALUE" if isinstance(args[i], ScalarSpec) else option
            raise CommandLineError(
                f"@{function} argument {names[i]!r} ({args[i].mlir}) is not given; pass it with "
                f"{what.replace('NAME', names[i])}. Only trailing memref arguments may be left out (they are "
                "outputs the call allocates).")
    return Plan(function, names, args, n_given)


def parse_scalar(function: str, name: str, spec: ScalarSpec, text: str) -> bool | int | float | complex:
    """``text`` as a value of the scalar argument ``name``: a bool, an int, a float or a complex."""
    kind = spec.element.kind
    try:
        if kind == "bool":
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return lowered in ("true", "1")
        if kind == "int":
            return int(text, 0)
        value = float(text) if kind == "float" else complex(text)
    except ValueError:
        what = {"bool": "true or false", "int": "an integer", "float": "a number", "complex": "a complex number"}
        raise CommandLineError(
            f"--scalar {name}={text}: @{function} argument {name!r} is {spec.mlir}, which takes {what[kind]}"
        ) from None
    if cmath.isinf(value) and "inf" not in text.lower():
        raise CommandLineError(f"--scalar {name}={text}: the value overflows a double; @{function} argument "
                               f"{name!r} is {spec.mlir}")
    return value


def scalars(plan: Plan, given: dict[str, str]) -> dict[str, Any]:
    """The ``--scalar`` values, parsed; CommandLineError for one that names a memref."""
    values = {}
    for name, text in given.items():
        spec = plan.args[plan.names.index(name)]
        if not isinstance(spec, ScalarSpec):
            raise CommandLineError(f"--scalar {name}: @{plan.function} argument {name!r} is {spec.mlir}, not a scalar")
        values[name] = parse_scalar(plan.function, name, spec, text)
    return values


@dataclass
class Request:
    """A ``call`` or ``bench`` command as read: the source, the plan, each array argument's text
    (a path or a shape) and each scalar's value, by argument name."""

    parsed: ParsedSource
    plan: Plan
    arrays: dict[str, str]
    scalars: dict[str, Any]


def read_request(options: argparse.Namespace, option: str, entries: Sequence[str], value: str) -> Request:
    """Read FILE and FUNC, the array arguments ``entries`` (given with ``option``: ``--arg`` or ``--shape``,
    ``NAME=value``) and the ``--scalar`` ones, and check them against the function's signature."""
    parsed = read_source(options.file)
    function = check_function(parsed, options.file, options.function)
    names = argument_names(parsed, function)
    arrays = _pairs(entries, option, value, names)
    scalar_texts = _pairs(options.scalar, "--scalar", "VALUE", names)
    both = sorted(set(arrays) & set(scalar_texts))
    if both:
        raise CommandLineError(f"{both[0]} is given both as {option} and as --scalar")
    plan = plan_arguments(parsed, function, names, [*arrays, *scalar_texts], f"{option} NAME={value}")
    for name in arrays:
        if isinstance(plan.args[names.index(name)], ScalarSpec):
            raise CommandLineError(f"{option} {name}: @{function} argument {name!r} is a scalar; pass --scalar "
                                   f"{name}=VALUE")
    return Request(parsed, plan, arrays, scalars(plan, scalar_texts))


def parse_shape(name: str, text: str, option: str) -> tuple[int, ...]:
    """``4x5`` (or ``4,5``) as ``(4, 5)``; ``""`` is the 0-d shape."""
    parts = [p for p in re.split(r"[x,]", text.strip()) if p.strip()]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = (-1,)
    if any(n < 0 for n in shape):
        raise CommandLineError(f"{option} {name}={text}: a shape is sizes separated by x, e.g. 512x256")
    largest = np.iinfo(np.intp).max
    if any(n > largest for n in shape):
        raise CommandLineError(f"{option} {name}={text}: a size is at most {largest}")
    return shape


def _common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE.mlir", help="the MLIR source")
    parser.add_argument("function", metavar="FUNC", help="the func.func to call (without @)")
    parser.add_argument("--scalar", action="append", default=[], metavar="NAME=VALUE",
                        help="a scalar argument: an integer (0x.. too), a number, true/false")
    parser.add_argument("--pipeline", default=None, help='a preset ("default", "fast") or a pass pipeline')
    parser.add_argument("--opt-level", type=int, default=3, choices=range(4), help="LLVM optimization level")
    parser.add_argument("--lib", action="append", default=[], metavar="LIB",
                        help="a shared library the kernel calls into (a path, or a name such as mlir_c_runner_utils)")
    _schedule_option(parser)


def _schedule_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-schedule", "--schedule", dest="schedule", default=None, choices=SCHEDULES,
                        help="where the file's own transform schedule is applied: before-bufferization (the "
                             "default), after-bufferization, or skip (lower the file without it)")


# -- call ------------------------------------------------------------------------------


def _check_npy_size(file: BinaryIO, name: str, path: str) -> None:
    """CommandLineError if the ``.npy`` header at the start of ``file`` claims more data than the file holds
    (a truncated or forged file), before numpy allocates what it claims."""
    version = npy_format.read_magic(file)
    read_header = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
    shape, _, dtype = read_header(file)
    if dtype.hasobject:
        return  # refused by allow_pickle=False
    needed = math.prod(shape) * dtype.itemsize
    held = os.fstat(file.fileno()).st_size - file.tell()
    if needed > held:
        raise CommandLineError(f"--arg {name}={path}: its header says {dtype}{list(shape)} ({needed:,} bytes of "
                               f"data), but the file holds {held:,} bytes after it; the file is truncated or not "
                               "written by numpy.save")


def load_array(name: str, path: str) -> np.ndarray:
    """The array of a ``.npy`` file; CommandLineError if it cannot be read, is no ``.npy`` file or claims
    more data than it holds, or if its array does not fit in memory."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the open
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            os.close(handle)
            raise CommandLineError(f"--arg {name}={path}: not a regular file; pass a .npy file that numpy.save "
                                   "wrote")
        with os.fdopen(handle, "rb") as file:
            magic = file.read(6)
            file.seek(0)
            loaded = None
            if magic == b"\x93NUMPY":
                _check_npy_size(file, name, path)
                file.seek(0)
                loaded = np.load(file, allow_pickle=False)
    except CommandLineError:
        raise
    except (OSError, ValueError, EOFError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CommandLineError(f"--arg {name}={path}: cannot load it: {reason}") from None
    except MemoryError:
        raise CommandLineError(f"--arg {name}={path}: not enough memory to load its array") from None
    if loaded is None:
        what = "an .npz archive" if magic.startswith(b"PK") else "not a .npy file"
        raise CommandLineError(f"--arg {name}={path}: {what}; pass one .npy file (numpy.save) per argument")
    return loaded  # type: ignore[no-any-return]


def summary(array: np.ndarray) -> str:
    """``float32 (4, 5) min -1.2 max 3.4``, or ``= value`` for a 0-d array."""
    text = f"{array.dtype} {array.shape}"
    if array.ndim == 0:
        return f"{text} = {array[()]}"
    if array.size == 0:
        return f"{text} empty"
    if array.dtype.kind == "c":
        return f"{text} max |x| {np.abs(array).max():.6g}"
    if array.dtype.kind == "b":
        return f"{text} {np.count_nonzero(array)} true"
    values = array if array.dtype.kind in "iuf" else array.astype(np.float64)  # bf16, f8: ml_dtypes
    return f"{text} min {values.min():.6g} max {values.max():.6g}"


def _returned(kernel: Kernel, returned: Any) -> tuple[list[Any], list[Any]]:
    """A call's return value split into (outputs, results)."""
    spec = kernel.spec
    count = spec.n_outputs + len(spec.signature.results)
    values = [] if count == 0 else [returned] if count == 1 else list(returned)
    return values[:spec.n_outputs], values[spec.n_outputs:]


def _write_atomically(path: Path, array: np.ndarray) -> None:
    """Save ``array`` to a new file next to ``path`` and rename it into place: a link at ``path`` is replaced,
    never written through, and ``path`` never holds a partial file."""
    for attempt in itertools.count():
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{attempt}.tmp")
        try:
            handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        break
    try:
        with os.fdopen(handle, "wb") as file:
            np.save(file, array)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _save(directory: Path, name: str, value: Any) -> str:
    path = directory / f"{name}.npy"
    array = np.asarray(value)
    try:
        _write_atomically(path, array)
    except OSError as exc:
        raise CommandLineError(f"cannot write {path}: {exc.strerror or exc}") from None
    return f"{name}: {summary(array)} -> {path}"


def _refuse_overwriting_inputs(directory: Path, saved: Sequence[str], inputs: Sequence[tuple[str, str]]) -> None:
    """CommandLineError if a file the call would write is one of its ``inputs`` (each a path and how the
    command line gave it), by the same path or through a symbolic or hard link: one device and inode."""
    read = []
    for path, given in inputs:
        with contextlib.suppress(OSError):
            read.append((os.stat(path), path, given))
    for name in saved:
        target = directory / f"{name}.npy"
        try:
            written = os.stat(target)
        except OSError:
            continue
        for status, path, given in read:
            if (written.st_dev, written.st_ino) == (status.st_dev, status.st_ino):
                link = "" if os.path.abspath(path) == os.path.abspath(target) else f" ({target} is a link to {path})"
                raise CommandLineError(f"writing {name} to {target} would overwrite the input {given}{link}; "
                                       "pass another --out DIR")


def _out_directory(text: str) -> Path:
    directory = Path(text)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandLineError(f"cannot create --out {directory}: {exc.strerror or exc}") from None
    return directory


def run_call(options: argparse.Namespace) -> int:
    request = read_request(options, "--arg", options.arg, "PATH.npy")
    plan = request.plan
    values = dict(request.scalars)
    values.update((name, load_array(name, path)) for name, path in request.arrays.items())
    directory = _out_directory(options.out)
    kernel = make_kernel(request.parsed.text, plan.function, plan.given, options.pipeline, options.opt_level,
                         options.lib, options.schedule)
    written = [name for i, name in enumerate(plan.given) if i in kernel.spec.written and is_memref(plan.args[i])]
    saved = written + plan.outputs + [f"result{j}" for j in range(len(kernel.spec.signature.results))]
    inputs = [(path, f"--arg {name}={path}") for name, path in request.arrays.items()]
    _refuse_overwriting_inputs(directory, saved, [*inputs, (options.file, options.file)])
    outputs, results = _returned(kernel, kernel(*(values[n] for n in plan.given)))
    returned = [values[n] for n in written] + outputs + results
    lines = [_save(directory, name, value) for name, value in zip(saved, returned)]
    print("\n".join(lines) if lines else f"@{plan.function} wrote nothing and returned nothing")
    return 0


# -- bench -----------------------------------------------------------------------------


class Progress:
    """A progress line on ``stream``, shown once a run has taken longer than a second, erased at the end."""

    def __init__(self, stream: TextIO, delay: float = 1.0) -> None:
        self._stream = stream
        self._started = time.perf_counter()
        self._delay = delay
        self._shown = 0
        self._last = 0.0

    def update(self, text: str) -> None:
        now = time.perf_counter()
        if now - self._started < self._delay or now - self._last < 0.1:
            return
        line = f"memkernel bench: {text} ({now - self._started:.1f} s)"
        self._stream.write("\r" + line.ljust(self._shown))
        self._stream.flush()
        self._shown, self._last = len(line), now

    def close(self) -> None:
        if self._shown:
            self._stream.write("\r" + " " * self._shown + "\r")
            self._stream.flush()


def random_array(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Random floats (standard normal), bools and complex numbers; integers are all 1 (a safe divisor)."""
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind in "iu":
        return np.ones(shape, dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def smallest_shapes(kernel: Kernel, shapes: dict[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """The given arguments' shapes with every free dim 1: static dims, dims tied to them and the
    bounds of affine accesses keep their sizes, tied dims stay equal."""
    spec = kernel.spec
    sizes: dict[Dim, int] = {}
    for i, shape in shapes.items():
        arg = spec.signature.args[i]
        for k, given in enumerate(shape):
            static = arg.shape[k] if isinstance(arg, MemRefSpec) else None
            sizes[Dim(i, k)] = static if static is not None else min(given, 1)
    for _ in range(len(sizes) + 1):
        before = dict(sizes)
        for tie in spec.shapes.ties:
            if tie.b is None:
                if tie.a in sizes:
                    sizes[tie.a] = tie.size
            elif tie.a in sizes and tie.b in sizes:
                sizes[tie.a] = sizes[tie.b] = max(sizes[tie.a], sizes[tie.b])
        for bound in spec.shapes.bounds:
            if bound.target in sizes and all(d in sizes for _, d in bound.terms):
                lengths = [sizes[d] for _, d in bound.terms]
                needed = sum(c * (n - 1) for (c, _), n in zip(bound.terms, lengths)) + bound.constant + 1
                sizes[bound.target] = max(sizes[bound.target], needed)
        if sizes == before:
            break
    return {i: tuple(sizes[Dim(i, k)] for k in range(len(shape))) for i, shape in shapes.items()}


def _time_calls(call: Callable[[], Any], budget: float, repeat: int | None, progress: Progress,
                what: str) -> list[float]:
    """Per-call times: ``repeat`` batches, else batches until ``budget`` seconds; a batch is
    as many calls as take about a millisecond."""
    started = time.perf_counter()
    call()
    once = time.perf_counter() - started
    batch = max(1, min(1000, int(1e-3 / max(once, 1e-9))))
    times: list[float] = []
    started = time.perf_counter()
    while (len(times) < repeat) if repeat else (len(times) < 3 or time.perf_counter() - started < budget):
        t0 = time.perf_counter()
        for _ in range(batch):
            call()
        times.append((time.perf_counter() - t0) / batch)
        progress.update(f"{what}: {len(times) * batch} calls")
    return times


def _rate(amount: int, seconds: float, unit: str) -> str:
    """``amount / seconds`` in giga-``unit``; ``-`` when the kernel time is too small to measure."""
    return f"{amount / seconds / 1e9:.3g} {unit}" if seconds > 0 else f"- {unit} (kernel time too small to measure)"


def _seconds(t: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t / 1e-9:.3g} ns"


@dataclass
class Timing:
    """What ``bench`` measured, in seconds: compilation, and per call on the given and the smallest shapes."""

    compile: float
    calls: Sequence[float]
    overhead: Sequence[float]


def _random_arguments(plan: Plan, shapes: dict[int, tuple[int, ...]], scalars: dict[str, Any],
                      rng: np.random.Generator) -> list[Any]:
    """The given arguments: random arrays of ``shapes`` (by argument index) and the scalars."""
    arrays = {}
    for i, shape in shapes.items():
        dtype = plan.args[i].element.dtype
        given = f"--shape {plan.names[i]}={'x'.join(map(str, shape))}"
        size = math.prod(shape) * dtype.itemsize
        if math.prod(max(n, 1) for n in shape) * dtype.itemsize > np.iinfo(np.intp).max:  # numpy's own limit
            raise CommandLineError(f"{given}: numpy cannot make a {dtype} array of that shape: its sizes (the "
                                   f"zeros left out) times {dtype.itemsize} bytes exceed {np.iinfo(np.intp).max}")
        try:
            arrays[plan.names[i]] = random_array(shape, dtype, rng)
        except MemoryError:
            raise CommandLineError(f"{given}: not enough memory for an array of that shape ({size:,} bytes)") from None
    return [arrays[n] if n in arrays else scalars[n] for n in plan.given]


def run_bench(options: argparse.Namespace) -> int:
    request = read_request(options, "--shape", options.shape, "NxM")
    plan = request.plan
    shapes = {plan.names.index(n): parse_shape(n, text, "--shape") for n, text in request.arrays.items()}
    kernel = make_kernel(request.parsed.text, plan.function, plan.given, options.pipeline, options.opt_level,
                         options.lib, options.schedule)
    started = time.perf_counter()
    kernel.compile()
    compile_time = time.perf_counter() - started
    rng = np.random.default_rng(0)
    full = _random_arguments(plan, shapes, request.scalars, rng)
    outputs, results = _returned(kernel, kernel(*full))  # checks the shapes first
    small = _random_arguments(plan, smallest_shapes(kernel, shapes), request.scalars, rng)
    kernel(*small)
    progress = Progress(sys.stderr)
    try:
        calls = _time_calls(lambda: kernel(*full), 1.0, options.repeat, progress, "timing the call")
        overhead = _time_calls(lambda: kernel(*small), 0.2, None, progress, "timing the overhead")
    finally:
        progress.close()
    timing = Timing(compile_time, calls, overhead)
    print("\n".join(bench_report(kernel, plan, full, small, [*outputs, *results], timing)))
    return 0


def bench_report(kernel: Kernel, plan: Plan, full: Sequence[Any], small: Sequence[Any], returned: Sequence[Any],
                 timing: Timing) -> list[str]:
    """The lines ``memkernel bench`` prints: ``full`` and ``small`` are the arguments of the timed calls,
    ``returned`` the outputs and results of a call on ``full``."""

    def described(args: Sequence[Any]) -> str:
        return ", ".join(f"{n} {a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else f"{n}={a!r}"
                         for n, a in zip(plan.given, args))

    calls = timing.calls
    best, median, wrapper = min(calls), float(np.median(calls)), min(timing.overhead)
    kernel_time = max(best - wrapper, 0.0)
    size = sum(a.nbytes for a in [*full, *returned] if isinstance(a, np.ndarray))
    lines = [
        f"@{plan.function}({described(full)})" + (f" -> {', '.join(plan.outputs)} allocated" if plan.outputs else ""),
        f"  compile:          {_seconds(timing.compile)} (or loaded from the disk cache)",
        f"  call:             {_seconds(best)} best, {_seconds(median)} median of {len(calls)} batches "
        f"({kernel.invoker.last_path} path)",
        f"  wrapper overhead: {_seconds(wrapper)} (a call on the smallest shapes: {described(small)})",
        f"  kernel:           {_seconds(kernel_time)} (call - overhead)",
    ]
    lines.append(f"  bandwidth:        {_rate(size, kernel_time, 'GB/s')} ({size:,} bytes of arrays / kernel)")
    shapes = [a.shape if isinstance(a, np.ndarray) else None for a in [*full, *returned[:len(plan.outputs)]]]
    flops = linalg_flops(kernel, shapes)
    if flops is not None and flops[0] > 0:
        lines.append(f"  compute:          {_rate(flops[0], kernel_time, 'GFLOP/s')} ({flops[0]:,} flops: "
                     f"{', '.join(flops[1])})")
    return lines


# -- flops of linalg ops -------------------------------------------------------------------

_FLOPS = {name: 1 for name in (
    "arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.remf", "arith.negf", "arith.maximumf",
    "arith.minimumf", "arith.maxnumf", "arith.minnumf", "arith.addi", "arith.subi", "arith.muli", "arith.divsi",
    "arith.divui", "arith.remsi", "arith.remui", "arith.maxsi", "arith.minsi", "arith.maxui", "arith.minui")}
_FLOPS["math.fma"] = 2
_LOOPS = ("scf.for", "scf.while", "scf.parallel", "scf.forall", "affine.for", "affine.parallel", "cf.br", "cf.cond_br")


def _body_flops(op: Any) -> int:
    count = 0
    for inner in op.regions[0].blocks[0].operations:
        name = inner.operation.name
        count += _FLOPS.get(name, 1 if name.startswith("math.") else 0)
    return count


def linalg_flops(kernel: Kernel, shapes: Sequence[tuple[int, ...] | None]) -> tuple[int, list[str]] | None:
    """The arithmetic a call does, when all of it is in linalg ops on the kernel's arguments:
    per op, its iterations (the sizes of its loop dims, read from the arguments' ``shapes`` through
    the indexing maps) times the arithmetic ops of its body (``linalg.matmul``: 2·M·N·K).
    None when the kernel has loops of its own or an op whose loop sizes are not all known."""
    parsed = parse_source(kernel.options.source)
    with MLIR_LOCK, parsed.context:
        names = structured_names(parsed.module)
        passmanager.PassManager.parse("builtin.module(func.func(linalg-generalize-named-ops))").run(
            parsed.module.operation)
        func = parsed.function(kernel.spec.name)
        entry = func.regions[0].blocks[0]
        total, described = 0, []
        for op in _walk(func):
            if op.name in _LOOPS or (op.name.startswith("linalg.") and "indexing_maps" not in op.attributes
                                     and op.name not in ("linalg.yield", "linalg.index")):
                return None
            if not op.name.startswith("linalg.") or "indexing_maps" not in op.attributes:
                continue
            if not unconditional(op, func):
                return None
            maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
            loops: dict[int, int] = {}
            for value, amap in zip(op.operands, maps):
                arg = argument_of(value, entry)
                shape = shapes[arg] if arg is not None and arg < len(shapes) else None
                for k, expr in enumerate(amap.results if shape is not None else []):
                    if isinstance(expr, ir.AffineDimExpr):
                        loops[expr.position] = shape[k]  # type: ignore[index]
            per_iteration = _body_flops(op)
            if per_iteration == 0:
                continue
            if len(loops) != maps[0].n_dims:
                return None
            total += per_iteration * math.prod(loops.values())
            described.append(f"{names.get(str(op.location), op.name)} {per_iteration}·" + "·".join(
                str(loops[d]) for d in sorted(loops)))
    return total, described


def _walk(op: Any) -> Iterator[Any]:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _walk(inner.operation)


# -- main --------------------------------------------------------------------------------


CONVENTION = """\
Arguments are named as in the MLIR source (%a is a; %in, %out, %result0 are
in_, out_, result0_; %0 is arg<i>).
The arguments you give are the leading ones and are passed in place: what the
kernel writes into them is saved. Trailing memref arguments you leave out are
outputs the call allocates; their ? dims come from the dims they are tied to."""

CALL_EXAMPLE = CONVENTION + """

example:
  memkernel call matmul.mlir matmul --arg a=a.npy --arg b=b.npy --out results
  (writes results/c.npy, c being matmul's third argument, allocated)"""

BENCH_EXAMPLE = CONVENTION + """ Integer arrays are
filled with 1, floats with standard normal values.

example:
  memkernel bench matmul.mlir matmul --shape a=512x512 --shape b=512x512 --pipeline fast"""


# -- run: an MLIR test file, as mlir-runner runs it -------------------------------------------

RUNNER_RESULTS = ("void", "i32", "i64", "f32")
"""The ``--entry-point-result`` types of ``mlir-runner``, which ``memkernel run`` takes too."""

_RUNNER_EXAMPLE = """\
Runs the entry (a func.func, or an llvm.func on scalars, taking no arguments) as
`mlir-opt ... | mlir-runner -e main -entry-point-result=void` does: memkernel lowers the
file with its default pipeline (or --pipeline), applies a transform schedule the file
carries (--schedule), links the MLIR runtime libraries it calls, and prints what the entry
prints, then its i32/i64/f32 result as mlir-runner prints it. A failed cf.assert prints its
message and exits with status 1. Options take one dash or two.

examples (lit RUN lines):
  // RUN: memkernel run %s -e main -entry-point-result=void | FileCheck %s
  // RUN: mlir-opt %s -convert-to-llvm | memkernel run - -e main | FileCheck %s
  // RUN: not memkernel run %s -e main | FileCheck %s --check-prefix=ASSERT"""


def _read_runner_source(path: str) -> str:
    """The MLIR text of ``path`` (``-``: standard input); CommandLineError if it cannot be read."""
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CommandLineError(f"cannot read {path}: {reason}") from None


def _entries(parsed: ParsedSource) -> list[str]:
    """The functions with a body that ``run`` may call: ``func.func`` and ``llvm.func``."""
    with MLIR_LOCK, parsed.context:
        return [ir.StringAttr(op.attributes["sym_name"]).value for op in parsed.module.body.operations
                if op.operation.name in ("func.func", "llvm.func") and len(op.regions[0].blocks) > 0]


def runner_kernel(source: str, path: str, entry: str, result: str, *, pipeline: str | None = None,
                  opt_level: int = 3, shared_libs: Sequence[str] = (), llvm_options: Sequence[str] = (),
                  schedule: str | None = None) -> Kernel:
    """The kernel ``memkernel run`` calls: ``@entry`` of ``source`` (read from ``path``), which must
    take no arguments and return what ``result`` (one of :data:`RUNNER_RESULTS`) says.
    ``llvm_options`` are LLVM's command-line options for its code generation (``-enable-matrix``);
    ``schedule`` where the file's transform schedule is applied (``"skip"``: not at all).

    Its printed output is captured into ``sys.stdout``/``sys.stderr``, in order with Python's.
    Raises CommandLineError, or the kernel's MLIRSyntaxError, SignatureError or CompileError.
    """
    if result not in RUNNER_RESULTS:
        raise CommandLineError(f"--entry-point-result={result}: expected one of {', '.join(RUNNER_RESULTS)}")
    parsed = parse_source(source)
    entry = entry.removeprefix("@")
    entries = _entries(parsed)
    if entry not in entries:
        raise CommandLineError(
            f"{path} defines no function @{entry} with a body; it defines: {', '.join(entries) or 'none'}. "
            "Pass -e NAME.")

    with MLIR_LOCK, parsed.context:
        _check_entry(read_signature(parsed.function(entry)), result)

    return mlir_kernel(source, name=entry, pipeline=pipeline, opt_level=opt_level, shared_libs=shared_libs,
                       capture_output=True, llvm_options=llvm_options,
                       schedule=schedule)(named_parameters(entry, ()))


def _check_entry(signature: Signature, result: str) -> None:
    """CommandLineError unless the entry takes no arguments and returns what ``result`` says."""
    entry = signature.name
    if signature.args:
        raise CommandLineError(
            f"@{entry} takes {len(signature.args)} argument(s) ({', '.join(a.mlir for a in signature.args)}); "
            "an entry point takes none, as mlir-runner calls it. Call it with `memkernel call` instead.")
    returned = [r.mlir for r in signature.results]
    if returned != ([] if result == "void" else [result]):
        shown = ", ".join(returned) or "nothing"
        fix = f"--entry-point-result={returned[0]}" if len(returned) == 1 and returned[0] in RUNNER_RESULTS \
            else "an entry point returning nothing, i32, i64 or f32"
        raise CommandLineError(f"@{entry} returns {shown}, but --entry-point-result={result} expects "
                               f"{'nothing' if result == 'void' else result}; pass {fix}.")


def runner_result(value: Any, result: str) -> str | None:
    """The line ``mlir-runner`` prints for the entry's result: integers in decimal, f32 as C's ``%e``
    (``2.500000e+00``, ``nan``, ``INF``); None for ``void``."""
    if result == "void":
        return None
    if result == "f32":
        number = float(value)
        if math.isnan(number):
            return "nan"
        if math.isinf(number):
            return "-INF" if number < 0 else "INF"
        return f"{number:e}"
    return str(int(value))


def call_entry(kernel: Kernel, result: str) -> KernelAssertionError | None:
    """Call a :func:`runner_kernel` as ``mlir-runner`` does: what it prints goes to ``sys.stdout``, then the
    line of its ``result``. A failed ``cf.assert`` stops it: its message is printed there instead, as MLIR's
    lowering of the assertion prints it before aborting, and the KernelAssertionError is returned."""
    try:
        value = kernel()
    except KernelAssertionError as failed:
        print(failed.assertion, flush=True)
        return failed
    printed = runner_result(value, result)
    if printed is not None:
        print(printed)
    return None


def _libraries(entries: Sequence[str]) -> list[str]:
    """The ``--shared-libs`` values, each a comma-separated list as mlir-runner takes it."""
    return [lib for entry in entries for lib in entry.split(",") if lib]


def run_run(options: argparse.Namespace) -> int:
    source = _read_runner_source(options.file)
    path = "<stdin>" if options.file == "-" else options.file
    kernel = runner_kernel(source, path, options.entry, options.entry_point_result, pipeline=options.pipeline,
                           opt_level=options.opt_level, shared_libs=_libraries(options.shared_libs),
                           llvm_options=options.llvm_options, schedule=options.schedule)
    failed = call_entry(kernel, options.entry_point_result)
    if failed is not None:
        raise failed
    return 0


def add_run_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """The ``run`` subcommand: an MLIR test file's entry, run as ``mlir-runner`` runs it."""
    run = commands.add_parser("run", parents=[common], help="run a test file's entry point as mlir-runner does",
                              epilog=_RUNNER_EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter,
                              description="Compile FILE.mlir and call its entry point, printing what it prints.")
    run.add_argument("file", metavar="FILE.mlir", help="the MLIR source (- reads standard input)")
    run.add_argument("-e", dest="entry", default="main", metavar="NAME",
                     help="the function to call, taking no arguments (default: main)")
    run.add_argument("-entry-point-result", "--entry-point-result", dest="entry_point_result", default="void",
                     choices=RUNNER_RESULTS, help="what the entry returns; its value is printed (default: void)")
    run.add_argument("-shared-libs", "--shared-libs", dest="shared_libs", action="append", default=[],
                     metavar="LIB,...", help="libraries the code calls into: paths, or names such as "
                                             "mlir_c_runner_utils (the MLIR runtime libraries are linked as needed)")
    run.add_argument("-O", dest="opt_level", type=int, default=3, choices=range(4), metavar="{0,1,2,3}",
                     help="LLVM optimization level, -O0 to -O3 (default: 3)")
    run.add_argument("-pipeline", "--pipeline", dest="pipeline", default=None,
                     help='a preset ("default", "fast") or a pass pipeline (default: the default preset)')
    run.add_argument("--llvm-option", dest="llvm_options", action="append", default=[], metavar="-OPTION",
                     help="an LLVM option for code generation, such as --llvm-option=-enable-matrix "
                          "(which mlir-runner takes as -enable-matrix)")
    _schedule_option(run)
    run.set_defaults(run=run_run)


BUILD_EXAMPLE = """example:
  memkernel build mypackage.kernels --target-cpu x86-64-v3
  # writes mypackage/_memkernel/: ship it as package data (see the README's "Shipping kernels")
"""


def run_build(options: argparse.Namespace) -> int:
    from .compile.artifacts import build

    for built in build(options.module, options.output, options.target_cpu):
        print(f"{built.module}.{built.name}: {built.path}")
    return 0


def add_build_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """The ``build`` subcommand: a module's kernels compiled into artifacts a package ships."""
    build = commands.add_parser("build", parents=[common], help="build a module's kernels for shipping",
                                epilog=BUILD_EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Import MODULE and compile every kernel it defines at its top level "
                                            "into a shared object, with a manifest that @mlir_kernel reads where "
                                            "the MLIR bindings are not installed.")
    build.add_argument("module", metavar="MODULE", help="a dotted module name, or a .py file")
    build.add_argument("--target-cpu", default=None, metavar="CPU",
                       help="build for an x86-64 level (x86-64, x86-64-v2, x86-64-v3, x86-64-v4) rather than "
                            "this machine's CPU")
    build.add_argument("-o", dest="output", default=None, metavar="DIR",
                       help="where to write the artifacts (default: _memkernel beside the module)")
    build.set_defaults(run=run_build)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    """The ``memkernel`` argument parser, with its ``info``, ``call`` and ``bench`` subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a command's default must not undo a --traceback given before the command.
    common.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    top = argparse.ArgumentParser(
        prog="memkernel", parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Look at, call and time the func.func kernels of an MLIR file. With no command, "
                    "`python -m memkernel` runs a demo.",
        epilog=CONVENTION)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = commands.add_parser("info", parents=[common], help="show each function's arguments and results",
                               description="Show each function with a body: its call signature, its arguments' "
                                           "MLIR types, numpy dtypes, shape patterns and tied dims, which it "
                                           "writes, and its results.")
    info.add_argument("file", metavar="FILE.mlir", help="the MLIR source")
    info.set_defaults(run=run_info)
    call = commands.add_parser("call", parents=[common], help="call a function on .npy files", epilog=CALL_EXAMPLE,
                               formatter_class=argparse.RawDescriptionHelpFormatter,
                               description="Call FUNC on .npy inputs; write the outputs, the arguments it "
                                           "writes in place and its results (result0, ...) as NAME.npy in DIR.")
    _common_options(call)
    call.add_argument("--arg", action="append", default=[], metavar="NAME=PATH.npy", help="an array argument")
    call.add_argument("--out", default=".", metavar="DIR", help="where to write the .npy files (default: .)")
    call.set_defaults(run=run_call)
    bench = commands.add_parser("bench", parents=[common], help="time a function on random inputs",
                                epilog=BENCH_EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Time FUNC on random inputs of the given shapes; split the time "
                                            "into the wrapper's overhead (a call on the smallest shapes) and "
                                            "the kernel's, with GB/s and, for linalg ops, GFLOP/s.")
    _common_options(bench)
    bench.add_argument("--shape", action="append", default=[], metavar="NAME=NxM",
                       help="an array argument's shape (random data; integers are 1)")
    bench.add_argument("--repeat", type=_positive, default=None, metavar="N",
                       help="time N batches of calls (default: as many as fit in a second)")
    bench.set_defaults(run=run_bench)
    add_run_command(commands, common)
    add_build_command(commands, common)
    return top


def error_line(error: MemkernelError) -> str:
    """What the command line prints on stderr for ``error`` before it exits with status 1."""
    return f"memkernel: error: {error}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    options = parser().parse_args(argv)
    try:
        return int(options.run(options))
    except MemkernelError as exc:
        if getattr(options, "traceback", False):
            traceback.print_exc()
        print(error_line(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nmemkernel: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
