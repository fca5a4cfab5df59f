"""Counting the async runtime's tasks, so that a parallel kernel's code is freed only when no thread runs in it.

A ``parallel=True`` kernel hands its loop bodies to the MLIR async runtime
(``libmlir_async_runtime``) through ``mlirAsyncRuntimeExecute(handle, resume)``:
a thread of the runtime's pool later calls ``resume(handle)``, which is the
kernel's code. The call returns to Python as soon as the last body has marked
its token ready, while the pool thread that did so may still be in the kernel's
code, on its way back to the pool. Freeing the code then crashes that thread.

:func:`symbols` gives the wrappers a kernel's object links instead of the
runtime's functions. Ours of ``mlirAsyncRuntimeExecute`` counts the task and
hands the runtime a resume function of its own, which calls the kernel's and
then counts the task done; :func:`running` tells how many have not come back:
none, and no pool thread is in any kernel's code. (A pool thread reaches a
kernel's code only through a task: the awaiters a token or group runs when it
becomes ready run on the thread that made it ready, inside a task or a call.)

A task started from inside a task (a parallel kernel called from a callback of
one, on a pool thread) is not queued on the pool, whose every thread may be
waiting for it: it goes on that task's own queue, which its thread runs before
it blocks on an await (our wrappers of the blocking awaits) and before the task
ends. (It cannot run at once, inside ``mlirAsyncRuntimeExecute``: the code
calling it still uses the coroutine frame that running it would free.)

The wrappers are compiled once per process from the LLVM IR below, through
libLLVM (no MLIR needed), and never freed. A task whose record cannot be
allocated (24 bytes: the process is out of memory) goes to the pool uncounted.
"""

from __future__ import annotations

import ctypes
import os

from ..options import ASYNC_RUNTIME
from .objects import ObjectLoadError, check, libllvm, message
from .. import forking

_RUNTIME_FILE = f"lib{ASYNC_RUNTIME}.so"
_libc = ctypes.CDLL(None)

_WRAPPERS = {
    "mlirAsyncRuntimeExecute": "memkernel_async_execute",
    "mlirAsyncRuntimeAwaitToken": "memkernel_async_await_token",
    "mlirAsyncRuntimeAwaitValue": "memkernel_async_await_value",
    "mlirAsyncRuntimeAwaitAllInGroup": "memkernel_async_await_group",
}
"""The async runtime's functions that start a task or block on one, and the wrappers kernels link instead."""

_IR = b"""
; A task is { ptr handle, ptr resume, ptr next }. The thread-specific value of @memkernel_task_key is null on
; a thread outside a task, and inside one the address of that task's queue: the tasks it started, to be run
; on this thread before it blocks on an await and before the task ends.

@memkernel_async_tasks = global i64 0, align 8
@memkernel_task_key = global i32 0, align 4

declare void @mlirAsyncRuntimeExecute(ptr, ptr)
declare void @mlirAsyncRuntimeAwaitToken(ptr)
declare void @mlirAsyncRuntimeAwaitValue(ptr)
declare void @mlirAsyncRuntimeAwaitAllInGroup(ptr)
declare ptr @malloc(i64)
declare void @free(ptr)
declare ptr @pthread_getspecific(i32)
declare i32 @pthread_setspecific(i32, ptr)

define private void @memkernel_async_run(ptr %handle, ptr %resume) {
  %key = load i32, ptr @memkernel_task_key
  %outer = call ptr @pthread_getspecific(i32 %key)
  %queue = alloca ptr
  store ptr null, ptr %queue
  %set = call i32 @pthread_setspecific(i32 %key, ptr %queue)
  call void %resume(ptr %handle)
  call void @memkernel_async_drain(ptr %queue)
  %reset = call i32 @pthread_setspecific(i32 %key, ptr %outer)
  %ignored = atomicrmw sub ptr @memkernel_async_tasks, i64 1 seq_cst
  ret void
}

define private void @memkernel_async_drain(ptr %queue) {
entry:
  br label %loop
loop:
  %task = load ptr, ptr %queue
  %empty = icmp eq ptr %task, null
  br i1 %empty, label %done, label %next
next:
  %next.at = getelementptr inbounds ptr, ptr %task, i64 2
  %rest = load ptr, ptr %next.at
  store ptr %rest, ptr %queue
  %resume.at = getelementptr inbounds ptr, ptr %task, i64 1
  %handle = load ptr, ptr %task
  %resume = load ptr, ptr %resume.at
  call void @free(ptr %task)
  call void @memkernel_async_run(ptr %handle, ptr %resume)
  br label %loop
done:
  ret void
}

define private void @memkernel_async_drain_here() {
  %key = load i32, ptr @memkernel_task_key
  %queue = call ptr @pthread_getspecific(i32 %key)
  %outside = icmp eq ptr %queue, null
  br i1 %outside, label %done, label %drain
drain:
  call void @memkernel_async_drain(ptr %queue)
  br label %done
done:
  ret void
}

define private void @memkernel_async_resume(ptr %task) {
  %resume.at = getelementptr inbounds ptr, ptr %task, i64 1
  %handle = load ptr, ptr %task
  %resume = load ptr, ptr %resume.at
  call void @free(ptr %task)
  call void @memkernel_async_run(ptr %handle, ptr %resume)
  ret void
}

define void @memkernel_async_execute(ptr %handle, ptr %resume) {
entry:
  %task = call ptr @malloc(i64 24)
  %failed = icmp eq ptr %task, null
  br i1 %failed, label %uncounted, label %counted
uncounted:
  call void @mlirAsyncRuntimeExecute(ptr %handle, ptr %resume)
  ret void
counted:
  %ignored = atomicrmw add ptr @memkernel_async_tasks, i64 1 seq_cst
  store ptr %handle, ptr %task
  %resume.at = getelementptr inbounds ptr, ptr %task, i64 1
  store ptr %resume, ptr %resume.at
  %key = load i32, ptr @memkernel_task_key
  %queue = call ptr @pthread_getspecific(i32 %key)
  %outside = icmp eq ptr %queue, null
  br i1 %outside, label %pool, label %here
pool:
  call void @mlirAsyncRuntimeExecute(ptr %task, ptr @memkernel_async_resume)
  ret void
here:
  %next.at = getelementptr inbounds ptr, ptr %task, i64 2
  %head = load ptr, ptr %queue
  store ptr %head, ptr %next.at
  store ptr %task, ptr %queue
  ret void
}

define void @memkernel_async_await_token(ptr %token) {
  call void @memkernel_async_drain_here()
  call void @mlirAsyncRuntimeAwaitToken(ptr %token)
  ret void
}

define void @memkernel_async_await_value(ptr %value) {
  call void @memkernel_async_drain_here()
  call void @mlirAsyncRuntimeAwaitValue(ptr %value)
  ret void
}

define void @memkernel_async_await_group(ptr %group) {
  call void @memkernel_async_drain_here()
  call void @mlirAsyncRuntimeAwaitAllInGroup(ptr %group)
  ret void
}
"""


class _Counter:
    """The compiled wrapper's two addresses, in a JIT of its own that lives as long as the process."""

    def __init__(self, runtime: str, key: int) -> None:
        llvm = libllvm()
        jit = ctypes.c_void_p()
        check(llvm.LLVMOrcCreateLLJIT(ctypes.byref(jit), None))
        dylib = llvm.LLVMOrcLLJITGetMainJITDylib(jit)
        for path in (None, runtime):
            generator = ctypes.c_void_p()
            if path is None:
                check(llvm.LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                    ctypes.byref(generator), b"\0", None, None))
            else:
                check(llvm.LLVMOrcCreateDynamicLibrarySearchGeneratorForPath(
                    ctypes.byref(generator), path.encode(), b"\0", None, None))
            llvm.LLVMOrcJITDylibAddGenerator(dylib, generator)
        context = llvm.LLVMContextCreate()
        buffer = llvm.LLVMCreateMemoryBufferWithMemoryRangeCopy(_IR, len(_IR), b"memkernel-async-tasks")
        module = ctypes.c_void_p()
        error = ctypes.c_void_p()
        if llvm.LLVMParseIRInContext(context, buffer, ctypes.byref(module), ctypes.byref(error)):
            text = message(error.value, "LLVMDisposeMessage") if error.value else ""
            raise ObjectLoadError(f"the async task counter does not parse: {text}")
        shared_context = llvm.LLVMOrcCreateNewThreadSafeContextFromLLVMContext(context)
        check(llvm.LLVMOrcLLJITAddLLVMIRModule(jit, dylib, llvm.LLVMOrcCreateNewThreadSafeModule(
            module, shared_context)))
        llvm.LLVMOrcDisposeThreadSafeContext(shared_context)
        self._jit = jit  # never disposed: pool threads may return into this code at any time
        ctypes.c_uint.from_address(self._lookup("memkernel_task_key")).value = key
        self.symbols = {name: self._lookup(wrapper) for name, wrapper in _WRAPPERS.items()}
        self.tasks = ctypes.c_int64.from_address(self._lookup("memkernel_async_tasks"))

    def _lookup(self, name: str) -> int:
        address = ctypes.c_uint64()
        check(libllvm().LLVMOrcLLJITLookup(self._jit, ctypes.byref(address), name.encode()))
        return address.value


def async_runtime(libraries: tuple[str, ...]) -> str | None:
    """The path of the async runtime among ``libraries`` (an object's), or None."""
    return next((path for path in libraries if os.path.basename(path) == _RUNTIME_FILE), None)


_counters: dict[str, _Counter] = {}
"""The wrappers of each async runtime library (by path) a kernel has linked; made once, under ``_lock``."""
_key: list[int] = []
"""The one thread-specific key all wrappers share, so that a task of one runtime's kernel that starts one of
another's (its library found at another path) still keeps it on its own queue."""
_lock = forking.lock()


def symbols(runtime: str) -> dict[str, int]:
    """The async runtime functions a kernel's object links to the wrappers, by name, with the wrappers'
    addresses; they start and await tasks on ``runtime`` (the async runtime library's path). Raises
    ObjectLoadError if LLVM cannot compile them."""
    with _lock:
        if runtime not in _counters:
            if not _key:
                key = ctypes.c_uint()
                if _libc.pthread_key_create(ctypes.byref(key), None):
                    raise ObjectLoadError("the async task wrappers got no thread-specific key "
                                          "(pthread_key_create failed)")
                _key.append(key.value)
            _counters[runtime] = _Counter(runtime, _key[0])
        return _counters[runtime].symbols


def running() -> int:
    """How many tasks started through the wrappers have not yet returned from a kernel's code."""
    return sum(counter.tasks.value for counter in list(_counters.values()))
