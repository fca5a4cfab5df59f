"""The compiled fast path: a CPython builtin, emitted into each kernel's module, that checks and
marshals a call's arguments in machine code (see :mod:`memkernel.compile.fast_path`)."""
