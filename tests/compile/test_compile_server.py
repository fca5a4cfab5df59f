"""The resident compile server: a fresh process finds one ready, only the same user may use it, it ends when idle
or when its socket goes, and an abort, a dead caller or a Ctrl-C never costs more than the request."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import memkernel.compile.worker as compile_worker
from memkernel import CompileError
from memkernel.compile import resident
from memkernel.load.cache import disk_cache
from memkernel.subprocesses import peer_credentials

from .test_worker import (FORK_WHILE_A_THREAD_WAITS, MATRIX, REPO, _sleep_in_two_threads, add_kernel,
                          check_add, flat_transpose, unique_add)
from ..processes import alive, wait_for

ON = {"MEMKERNEL_COMPILE_SERVER_IDLE": "30"}
"""The environment of these tests' processes: the server on (the session's conftest turns it off)."""


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Path]:
    """A cache folder of the test's own; the servers in it are ended afterwards (their socket files removed)."""
    folder = tmp_path / "cache"
    yield folder
    _end_servers(folder)


@pytest.fixture
def here(cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process compiles through a server in ``cache``."""
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(cache))
    monkeypatch.setenv("MEMKERNEL_COMPILE_SERVER_IDLE", "30")
    return cache


def _end_servers(folder: Path) -> None:
    pids = []
    for path in folder.glob("compile-*"):
        if path.is_socket():
            pids.append(_pid_of(folder, path.name))
            path.unlink()
    for pid in pids:
        wait_for(lambda: not alive(pid) if pid else True)


def _pid_of(folder: Path, name: str) -> int | None:
    """The server's pid for socket ``name`` in ``folder`` (None if none answers)."""
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(resident.address(folder, handle, name))
            return peer_credentials(connection)[0]
    except OSError:
        return None
    finally:
        os.close(handle)


def _sockets(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.glob("compile-*") if path.is_socket())


def _server(folder: Path, options: tuple[str, ...] = ()) -> int | None:
    with disk_cache() as opened:
        assert opened is not None and opened.path == folder
        return resident.server_pid(opened, options)


def _script(script: str, cache: Path, **environ: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": REPO, "MEMKERNEL_CACHE_DIR": str(cache), **ON, **environ}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)


def _finished(process: subprocess.Popen[str], timeout: float = 120) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"exit status {process.returncode}:\n{err}"
    return out


# Compiles a new add kernel, checks it against numpy, prints the pid of the server that compiled it.
COMPILE_AND_NAME_THE_SERVER = """
import sys, uuid
import numpy as np
sys.path.append("tests")
from kernels import elementwise
from memkernel import mlir_kernel
from memkernel.compile import resident
from memkernel.load.cache import disk_cache
from memkernel.subprocesses import peer_credentials
name = "add_" + uuid.uuid4().hex[:12]
add = mlir_kernel(elementwise("arith.addf", "memref<?xf64>", "f64", 1, name=name), name=name)(lambda a, b: None)
a = np.arange(5.0)
assert np.array_equal(add(a, a), a + a)
with disk_cache() as folder:
    print(resident.server_pid(folder, ()))
"""


def test_a_fresh_process_compiles_in_the_server_the_last_one_left_running(cache):
    first = int(_finished(_script(COMPILE_AND_NAME_THE_SERVER, cache)))
    second = int(_finished(_script(COMPILE_AND_NAME_THE_SERVER, cache)))
    assert first == second and alive(first)


def test_the_server_runs_detached_with_its_stderr_in_the_cache_folder(cache):
    pid = int(_finished(_script(COMPILE_AND_NAME_THE_SERVER, cache)))
    (name,) = _sockets(cache)
    assert os.getsid(pid) != os.getsid(0) and os.getpgid(pid) != os.getpgid(0)
    assert os.readlink(f"/proc/{pid}/fd/0") == os.readlink(f"/proc/{pid}/fd/1") == "/dev/null"
    assert os.readlink(f"/proc/{pid}/fd/2") == str(cache / f"{name}.log")
    assert (cache / name).stat().st_mode & 0o777 == 0o600


def test_the_socket_is_named_by_the_llvm_options_python_and_the_environment_that_picks_mlir(monkeypatch):
    names = {resident.server_name(()), resident.server_name(MATRIX)}
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    names.add(resident.server_name(()))
    monkeypatch.setattr(sys, "executable", "/another/python")
    resident._software.cache_clear()
    try:
        names.add(resident.server_name(()))
    finally:
        resident._software.cache_clear()
    assert len(names) == 4
    monkeypatch.setenv("MEMKERNEL_CHECKED", "1")  # resolved by the caller into the request: the same server
    assert resident.server_name(()) in names


def test_each_set_of_llvm_options_has_a_server_of_its_own(here):
    a = np.random.default_rng(1).standard_normal((4, 5))
    transposed = flat_transpose(cache=False, llvm_options=MATRIX)(a.ravel())
    np.testing.assert_array_equal(transposed.reshape(5, 4), a.T)
    check_add(add_kernel(cache=False))
    assert _server(here, MATRIX) not in (None, _server(here, ()))
    assert len(_sockets(here)) == 2


@pytest.mark.parametrize("setting", [{"MEMKERNEL_CACHE_DIR": ""}, {"MEMKERNEL_COMPILE_SERVER_IDLE": "0"}],
                         ids=["no disk cache", "idle 0"])
def test_without_the_disk_cache_or_with_idle_0_compiles_go_to_a_private_worker(here, monkeypatch, setting):
    for variable, value in setting.items():
        monkeypatch.setenv(variable, value)
    compile_worker.worker(()).close()
    check_add(add_kernel(cache=False))
    assert compile_worker.worker(()).pid() is not None
    assert not here.exists() or _sockets(here) == []


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_the_idle_time_must_be_a_number_of_seconds(here, monkeypatch, value):
    monkeypatch.setenv("MEMKERNEL_COMPILE_SERVER_IDLE", value)
    with pytest.raises(CompileError, match=rf"\$MEMKERNEL_COMPILE_SERVER_IDLE must be a number of seconds "
                                           rf"\(0 for no compile server\); got '{value}'"):
        add_kernel(cache=False).compile()


# Compiles, then forbids connecting to and starting a server, then loads the same kernel in a fresh process.
WARM_CACHE = """
import sys
import numpy as np
from memkernel import mlir_kernel
from memkernel.compile import resident
if sys.argv[2] == "forbid":
    def refuse(*args, **kwargs):
        raise AssertionError("used the compile server")
    resident._connect = resident._ensure_server = refuse
kernel = mlir_kernel(open(sys.argv[1]).read(), name=sys.argv[3])(lambda a, b: None)
a, b = np.arange(100.0), np.full(100, 0.5)
assert np.array_equal(kernel(a, b), a + b)
print("ok")
"""


def test_a_process_whose_kernels_are_all_in_the_disk_cache_starts_and_connects_to_no_server(cache, tmp_path):
    source, name = unique_add()
    (tmp_path / "kernel.mlir").write_text(source)
    arguments = [sys.executable, "-c", WARM_CACHE, str(tmp_path / "kernel.mlir")]
    env = {**os.environ, "PYTHONPATH": REPO, "MEMKERNEL_CACHE_DIR": str(cache), **ON}
    cold = subprocess.run([*arguments, "forbid", name], capture_output=True, text=True, env=env, timeout=120)
    assert cold.returncode != 0 and "used the compile server" in cold.stderr  # it must compile: the check bites
    assert subprocess.run([*arguments, "compile", name], capture_output=True, text=True, env=env,
                          timeout=120).stdout == "ok\n"
    warm = subprocess.run([*arguments, "forbid", name], capture_output=True, text=True, env=env, timeout=120)
    assert warm.stdout == "ok\n", warm.stderr


def test_decoration_starts_the_server_before_the_first_call(here):
    source, name = unique_add()
    from memkernel import mlir_kernel
    kernel = mlir_kernel(source, name=name)(lambda a, b: None)
    starting = resident._starting[resident.server_name(())]
    starting.join(60)
    assert _server(here) is not None
    check_add(kernel)


def test_processes_starting_at_once_start_one_server(cache):
    processes = [_script(COMPILE_AND_NAME_THE_SERVER, cache) for _ in range(3)]
    pids = {int(_finished(process)) for process in processes}
    assert len(pids) == 1
    (name,) = _sockets(cache)
    servers = [pid for pid in os.listdir("/proc") if pid.isdigit() and _command_names(int(pid), name, str(cache))]
    assert servers == [str(*pids)]


def _command_names(pid: int, *words: str) -> bool:
    """Whether process ``pid``'s command has each of ``words`` as an argument: a server's name is the same for
    every cache folder (other tests' servers, idle for a while, have it too), so this one's folder must be there."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as command:
            arguments = command.read().split(b"\0")
    except OSError:
        return False
    return all(word.encode() in arguments for word in words)


def test_a_socket_whose_server_is_gone_is_replaced(cache):
    first = int(_finished(_script(COMPILE_AND_NAME_THE_SERVER, cache)))
    os.kill(first, signal.SIGKILL)
    assert wait_for(lambda: not alive(first))
    assert len(_sockets(cache)) == 1  # left behind
    second = int(_finished(_script(COMPILE_AND_NAME_THE_SERVER, cache)))
    assert second != first and alive(second)


def test_the_server_ends_after_its_idle_time(cache):
    pid = int(_finished(_script(COMPILE_AND_NAME_THE_SERVER, cache, MEMKERNEL_COMPILE_SERVER_IDLE="1")))
    assert wait_for(lambda: not alive(pid))
    assert _sockets(cache) == []


@pytest.mark.parametrize("removal", ["socket", "folder"])
def test_the_server_ends_at_once_when_its_socket_or_cache_folder_is_removed(cache, removal):
    pid = int(_finished(_script(COMPILE_AND_NAME_THE_SERVER, cache)))
    if removal == "folder":
        subprocess.run(["rm", "-rf", str(cache)], check=True)
    else:
        (cache / _sockets(cache)[0]).unlink()
    assert wait_for(lambda: not alive(pid), seconds=3)


def test_an_abort_during_a_request_is_a_compile_error_naming_the_signal_and_the_next_compile_works(here):
    with pytest.raises(CompileError) as failed:
        flat_transpose(cache=False).compile()
    message = str(failed.value)
    assert "compiling @transpose crashed the compile server's process for it: it was killed by SIGABRT" in message
    assert "LLVM ERROR: Do not know how to widen the result of this operator!" in message
    check_add(add_kernel(cache=False))


def test_bad_llvm_options_are_a_compile_error_with_llvms_message(here):
    with pytest.raises(CompileError) as failed:
        flat_transpose(cache=False, llvm_options=("-no-such-llvm-option",)).compile()
    message = str(failed.value)
    assert "compile server with llvm_options=('-no-such-llvm-option',) ended" in message
    assert "Unknown command line argument '-no-such-llvm-option'" in message


def _requests_of(server: int) -> list[int]:
    with open(f"/proc/{server}/task/{server}/children") as children:
        return [int(pid) for pid in children.read().split()]


def _sleeping_in_the_server(cache: Path) -> tuple[subprocess.Popen[str], int, int]:
    """A process asking the server to sleep 60 s, the server and the process serving that request."""
    check = _script(COMPILE_AND_NAME_THE_SERVER, cache)
    server = int(_finished(check))
    client = _script("""
        import time
        import memkernel.compile.worker as compile_worker
        try:
            compile_worker.run((), "sleeping", time.sleep, 60)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """, cache)
    assert wait_for(lambda: len(_requests_of(server)) == 1)
    return client, server, _requests_of(server)[0]


def test_a_caller_killed_during_a_request_leaves_the_server_running_and_its_request_ended(cache):
    client, server, request = _sleeping_in_the_server(cache)
    client.kill()
    client.wait()
    assert wait_for(lambda: not alive(request), seconds=5)
    assert alive(server)
    assert int(_finished(_script(COMPILE_AND_NAME_THE_SERVER, cache))) == server


def test_ctrl_c_during_a_request_ends_the_wait_and_the_request(cache):
    client, server, request = _sleeping_in_the_server(cache)
    started = time.monotonic()
    client.send_signal(signal.SIGINT)
    assert _finished(client, timeout=10) == "interrupted\n"
    assert time.monotonic() - started < 10
    assert wait_for(lambda: not alive(request), seconds=5)
    assert alive(server)


def test_a_server_killed_during_a_request_is_a_compile_error_and_the_next_request_starts_a_new_one(here):
    check_add(add_kernel(cache=False))
    server = _server(here)
    assert server is not None
    failed: list[BaseException] = []

    def sleep() -> None:
        try:
            compile_worker.run((), "sleeping", time.sleep, 60)
        except BaseException as exc:  # noqa: BLE001  (the test looks at it)
            failed.append(exc)

    waiting = threading.Thread(target=sleep)
    waiting.start()
    assert wait_for(lambda: len(_requests_of(server)) == 1)
    os.kill(server, signal.SIGKILL)
    waiting.join(10)
    assert not waiting.is_alive()
    assert isinstance(failed[0], CompileError)
    assert str(failed[0]).startswith("the compile server went away during sleeping without a reply: it was killed, "
                                     "or MLIR or LLVM aborted on this kernel. It ended.")
    check_add(add_kernel(cache=False))
    assert _server(here) not in (None, server)


def test_requests_from_two_threads_at_once_run_in_parallel(here, monkeypatch):
    monkeypatch.setenv("MEMKERNEL_COMPILE_WORKERS", "2")
    check_add(add_kernel(cache=False))
    assert _sleep_in_two_threads(2.0) < 3.8


def test_memkernel_compile_workers_1_sends_one_request_at_a_time(here, monkeypatch):
    monkeypatch.setenv("MEMKERNEL_COMPILE_WORKERS", "1")
    resident._slots.clear()
    try:
        assert _sleep_in_two_threads(1.0) >= 2.0
    finally:
        resident._slots.clear()


def test_a_child_forked_while_another_thread_waits_on_the_server_runs(cache):
    script = FORK_WHILE_A_THREAD_WAITS.replace("compile_worker.worker(()).busy()", "resident._in_flight").replace(
        "import memkernel.compile.worker as compile_worker",
        "import memkernel.compile.worker as compile_worker\nfrom memkernel.compile import resident")
    out = _finished(_script(script, cache))
    assert out.splitlines()[-1] == "[0, 0, 0]"
    assert out.count("the child ran") == 3


# Forks while the server compiles for another thread; the child then compiles a kernel of its own there.
CHILD_COMPILES = """
import os, sys, threading, time
import numpy as np
sys.path.append("tests")
from kernels import elementwise
import memkernel.compile.worker as compile_worker
from memkernel import mlir_kernel
from memkernel.compile import resident
waiting = threading.Thread(target=compile_worker.run, args=((), "sleeping", time.sleep, 3))
waiting.start()
while not resident._in_flight:
    time.sleep(0.01)
pid = os.fork()
if pid == 0:
    add = mlir_kernel(elementwise("arith.addf", "memref<?xf64>", "f64", 1, name="child_add"), name="child_add",
                      cache=False)(lambda a, b: None)
    a = np.arange(4.0)
    os._exit(0 if np.array_equal(add(a, a), a + a) else 1)
_, status = os.waitpid(pid, 0)
waiting.join()
print(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_compiles_on_a_connection_of_its_own(cache):
    assert _finished(_script(CHILD_COMPILES, cache)).split() == ["0"]


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_a_connection_from_another_user_is_closed_unserved(cache, tmp_path):
    server = int(_finished(_script(COMPILE_AND_NAME_THE_SERVER, cache)))
    (name,) = _sockets(cache)
    with tempfile.TemporaryDirectory() as public:  # a way to the socket the other user may take: the server checks
        os.chmod(public, 0o755)
        os.link(cache / name, Path(public) / name)
        (cache / name).chmod(0o666)
        marker = tmp_path / "ran"
        stranger = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import os, pickle, socket, tempfile
            os.setgid(65534)
            os.setuid(65534)
            request = tempfile.TemporaryFile()
            request.write(pickle.dumps((os.system, ("touch {marker}",))))
            request.flush()
            connection = socket.socket(socket.AF_UNIX)
            connection.connect({str(Path(public) / name)!r})
            try:
                socket.send_fds(connection, [b"R"], [request.fileno(), 2])
                print(repr(connection.recv(4)))
            except ConnectionError:
                print("b''")
        """)], capture_output=True, text=True, timeout=60, cwd="/")
    assert stranger.stdout == "b''\n", stranger.stderr
    assert not marker.exists()
    assert alive(server)


def test_a_server_of_another_user_is_refused_by_the_caller(here, monkeypatch):
    check_add(add_kernel(cache=False))
    monkeypatch.setattr(resident, "peer_credentials", lambda connection: (1, 4242))
    with pytest.raises(CompileError, match=r"compile server socket .* belongs to a process of uid 4242, not yours "
                                           r"\(\d+\); a request is code it would run"):
        add_kernel(cache=False).compile()


def test_a_long_cache_folder_path_reaches_the_server_through_its_descriptor(monkeypatch):
    with tempfile.TemporaryDirectory(prefix="memkernel-" + "long" * 20) as folder:
        cache = Path(folder) / "cache"
        monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(cache))
        monkeypatch.setenv("MEMKERNEL_COMPILE_SERVER_IDLE", "30")
        try:
            check_add(add_kernel(cache=False))
            assert len(str(cache / _sockets(cache)[0])) > 108
            assert _server(cache) is not None
        finally:
            _end_servers(cache)


def _closing_server(folder: Path, connections: int) -> threading.Thread:
    """A stand-in server at the default options' socket in ``folder`` that closes ``connections`` connections
    without taking their request, then removes its socket, as a server ending idle does."""
    folder.mkdir(mode=0o700, exist_ok=True)
    name = resident.server_name(())
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(resident.address(folder, handle, name))
    listener.listen()

    def serve() -> None:
        with listener:
            for _ in range(connections):
                listener.accept()[0].close()
            os.unlink(name, dir_fd=handle)
        os.close(handle)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_a_request_a_server_closes_untaken_as_it_ends_goes_to_a_new_server(here):
    stand_in = _closing_server(here, 1)
    served_by = compile_worker.run((), "asking for the pid", os.getppid)
    stand_in.join(5)
    assert served_by == _server(here) != os.getpid()


def test_a_server_that_never_takes_requests_is_a_compile_error(here):
    stand_in = _closing_server(here, 3)
    with pytest.raises(CompileError, match=r"compile server in .* closed 3 connections in a row without taking "
                                           r"the request; its stderr is in .*compile-\w+\.log\. Set "
                                           r"MEMKERNEL_COMPILE_SERVER_IDLE=0"):
        compile_worker.run((), "asking for the pid", os.getppid)
    stand_in.join(5)


def test_a_server_started_at_decoration_outlives_a_process_that_exits_before_it_is_ready(cache):
    _finished(_script("""
        import sys
        sys.path.append("tests")
        from kernels import elementwise
        from memkernel import mlir_kernel
        mlir_kernel(elementwise("arith.addf", "memref<?xf64>", "f64", 1, name="early"), name="early")(lambda a, b: None)
    """, cache))
    assert wait_for(lambda: len(_sockets(cache)) == 1, seconds=30)
    assert int(_finished(_script(COMPILE_AND_NAME_THE_SERVER, cache))) == _pid_of(cache, _sockets(cache)[0])
