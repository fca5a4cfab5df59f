"""How a :class:`~memkernel.kernel.Kernel` shows itself in Jupyter: an HTML table.

:func:`kernel_html` renders what decoration read (each argument's MLIR type,
numpy dtype, shape pattern, tied dims and role; the results), the pipeline,
whether the kernel is compiled and how long that took, and the source in a
collapsed ``<details>``. Every piece of text is escaped: MLIR types and
sources are full of ``<`` and ``>``.

:func:`dim_labels`, :func:`shape_text` and :func:`tied_to` are also what ``memkernel info`` prints.
"""

from __future__ import annotations

from html import escape
from typing import Any, Protocol

from .model.kernel_spec import KernelSpec
from .model.shapes import Dim
from .model.signature import ArgSpec, MemRefSpec, ScalarSpec
from .options import KernelOptions


class Shown(Protocol):
    """What the table reads of a :class:`~memkernel.kernel.Kernel`."""

    spec: KernelSpec
    options: KernelOptions

    @property
    def compiled(self) -> bool: ...

    @property
    def compile_seconds(self) -> float | None: ...

    @property
    def invoker(self) -> Any: ...

_HEADERS = ("argument", "MLIR type", "dtype", "shape", "tied to", "role")


def role(spec: KernelSpec, index: int) -> str:
    """What MLIR argument ``index`` is to a call: an input, an output the call allocates, or written in place."""
    arg = spec.signature.args[index]
    if isinstance(arg, ScalarSpec):
        return "input (scalar)"
    if index >= spec.n_inputs:
        return "output (allocated, or out=)"
    if index in spec.written:
        return "written in place"
    return "input (tensor)" if arg.tensor else "input"


class _Components:
    """The dims that ties make equal, grouped: union-find over :class:`Dim`."""

    def __init__(self, spec: KernelSpec) -> None:
        self._parent: dict[Dim, Dim] = {}
        for tie in spec.shapes.ties:
            if tie.b is not None:
                self._parent[self.find(tie.a)] = self.find(tie.b)

    def find(self, dim: Dim) -> Dim:
        parent = self._parent.setdefault(dim, dim)
        if parent == dim:
            return dim
        root = self.find(parent)
        self._parent[dim] = root
        return root

    def members(self, dim: Dim) -> list[Dim]:
        root = self.find(dim)
        return sorted((d for d in self._parent if self.find(d) == root), key=lambda d: (d.arg, d.dim))


def _fixed_labels(spec: KernelSpec, components: _Components) -> dict[Dim, str]:
    """Labels of the tie groups that have one: a dim name, a size an annotation fixes, a static size."""
    labels: dict[Dim, str] = {}
    for index, names in sorted(spec.shapes.names.items()):
        for k, name in enumerate(names):
            if name != "_" and not name.isdigit():
                labels.setdefault(components.find(Dim(index, k)), name)
    for tie in spec.shapes.ties:
        if tie.b is None:
            labels.setdefault(components.find(tie.a), str(tie.size))
    for index, arg in enumerate(spec.signature.args):
        if isinstance(arg, MemRefSpec):
            for k, size in enumerate(arg.shape):
                if size is not None:
                    labels[components.find(Dim(index, k))] = str(size)
    return labels


def dim_labels(spec: KernelSpec) -> dict[int, tuple[str, ...]]:
    """Each ranked argument's dims as labels: the static size, the dim's name, ``d<n>`` for a dynamic
    dim tied to others (the same label on every dim it is tied to), ``?`` for a free dynamic dim."""
    components = _Components(spec)
    root_label = _fixed_labels(spec, components)
    labels: dict[int, tuple[str, ...]] = {}
    unnamed = 0
    for index, arg in enumerate(spec.signature.args):
        if not isinstance(arg, MemRefSpec):
            continue
        row = []
        for k in range(arg.rank):
            root = components.find(Dim(index, k))
            if root not in root_label and len(components.members(root)) > 1:
                root_label[root] = f"d{unnamed}"
                unnamed += 1
            row.append(root_label.get(root, "?"))
        labels[index] = tuple(row)
    return labels


def tied_to(spec: KernelSpec, index: int) -> list[str]:
    """For each dim of argument ``index`` tied to others: ``dim k = b dim 1, out dim 0``."""
    arg = spec.signature.args[index]
    if not isinstance(arg, MemRefSpec):
        return []
    components = _Components(spec)
    names = spec.argument_names
    notes = []
    for k in range(arg.rank):
        others = [d for d in components.members(Dim(index, k)) if d != Dim(index, k)]
        if others:
            notes.append(f"dim {k} = " + ", ".join(f"{names[d.arg]} dim {d.dim}" for d in others))
    notes += [f"dim {t.a.dim} = {t.size} ({t.reason})" for t in spec.shapes.ties if t.b is None and t.a.arg == index]
    return notes


def tie_reasons(spec: KernelSpec, index: int) -> str:
    """What ties argument ``index``'s dims: ``@matmul's linalg.matmul; M``."""
    components = _Components(spec)
    arg = spec.signature.args[index]
    mine = {components.find(Dim(index, k)) for k in range(arg.rank if isinstance(arg, MemRefSpec) else 0)}
    reasons = [t.reason for t in spec.shapes.ties
               if components.find(t.a) in mine or (t.b is None and t.a.arg == index)]
    return "; ".join(dict.fromkeys(reasons))


def shape_text(spec: KernelSpec, index: int, labels: dict[int, tuple[str, ...]]) -> str:
    """Argument ``index``'s shape pattern: ``(M, K)``, ``(d0, ?)``, ``scalar`` or ``any rank``."""
    arg = spec.signature.args[index]
    if isinstance(arg, ScalarSpec):
        return "scalar"
    if not isinstance(arg, MemRefSpec):
        return "any rank"
    dims = labels[index]
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def _result_shape(result: ArgSpec) -> str:
    if isinstance(result, ScalarSpec):
        return "scalar"
    if isinstance(result, MemRefSpec):
        dims = ["?" if d is None else str(d) for d in result.shape]
        return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"
    return "any rank"


def _cell(text: str, code: bool = False, title: str | None = None) -> str:
    inner = f"<code>{escape(text)}</code>" if code else escape(text)
    attribute = f' title="{escape(title)}"' if title else ""
    return f"<td{attribute}>{inner}</td>"


def _argument_rows(spec: KernelSpec) -> list[str]:
    labels = dim_labels(spec)
    rows = []
    for i, (arg, contract) in enumerate(zip(spec.signature.args, spec.contracts)):
        notes = tied_to(spec, i)
        rows.append("<tr>" + "".join([
            _cell(contract.name, code=True), _cell(arg.mlir, code=True), _cell(str(arg.element.dtype)),
            _cell(shape_text(spec, i, labels)), _cell("; ".join(notes), title=tie_reasons(spec, i) or None),
            _cell(role(spec, i)),
        ]) + "</tr>")
    for j, result in enumerate(spec.signature.results):
        rows.append("<tr>" + "".join([
            _cell(f"result {j}"), _cell(result.mlir, code=True), _cell(str(result.element.dtype)),
            _cell(_result_shape(result)), _cell(""), _cell("result"),
        ]) + "</tr>")
    return rows


def compile_state(kernel: Shown) -> str:
    """``compiled in 12.3 ms (fast path)`` or ``not compiled yet ...``."""
    if not kernel.compiled:
        return "not compiled yet (at the first call, or kernel.compile())"
    seconds = kernel.compile_seconds
    took = f" in {seconds * 1e3:.1f} ms" if seconds is not None else ""
    path = "fast path" if kernel.invoker.fast is not None else "checked path only"
    return f"compiled{took} ({path})"


def pipeline_text(options: KernelOptions) -> str:
    """The pipeline and its options as given to ``mlir_kernel``: ``default, opt_level=3``."""
    parts = [options.pipeline or "default", f"opt_level={options.opt_level}"]
    if options.parallel:
        parts.append("parallel=True")
    return ", ".join(parts)


def _facts(kernel: Shown) -> list[tuple[str, str]]:
    return [("pipeline", pipeline_text(kernel.options)), ("state", compile_state(kernel))]


def kernel_html(kernel: Shown) -> str:
    """The kernel as an HTML table (see the module docstring)."""
    spec = kernel.spec
    head = "".join(f"<th>{escape(h)}</th>" for h in _HEADERS)
    facts = "".join(f"<tr><th>{escape(k)}</th><td colspan=\"{len(_HEADERS) - 1}\">{escape(v)}</td></tr>"
                    for k, v in _facts(kernel))
    source = kernel.options.source
    lines = source.count("\n") + 1
    return (
        '<div class="memkernel-kernel">'
        f"<table><caption>memkernel.Kernel <code>@{escape(spec.name)}</code></caption>"
        f"<thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(_argument_rows(spec))}</tbody>"
        f"<tfoot>{facts}</tfoot></table>"
        f"<details><summary>MLIR source ({lines} lines)</summary><pre>{escape(source)}</pre></details>"
        "</div>"
    )

