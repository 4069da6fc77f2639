"""The stack's Python processes forked from one that imported their libraries once.

Each service, agent and embedded database started as a Python of its own imported pydantic, FastStream, PyMongo and
the rest again: ~0.6 s of CPU a process, ~6 s of every stack's start on two cores (ten such processes), and again at
every restart. The fork server imports them once, at the stack's start, and forks each process from itself; the
child then imports only its own modules and runs `python -m <module>` as that would (`runpy`, `__main__`).

What a child is given never passes through the server: the stack sends the server a socket and the child's log file
(SCM_RIGHTS), the server forks, and the child reads its request (argv, environment with its credentials, working
directory, umask) from that socket itself. The server holds no secret to leak into the next child: it is started with
the interpreter's variables alone (`PATH`, `PYTHON*`, the locale), and a child's environment replaces its own.

A child is what a `subprocess.Popen` would be: a session of its own, its output in its log, the signal it gets when
its parent (the server) dies, its exit status reported to the stack (`ForkedProcess`, Popen's `pid`, `poll`, `wait`,
`kill`) and reaped only once the stack has read it, so its pid is never reused while the stack may signal it. The
server ends when the stack closes its end or dies (the socket reads end of file), and its children get their signal.
"""

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shared.children import die_with, name_process

# Imported once in the server: what the services, the agents and the databases all import (their own modules not:
# a module of ours may read its settings at import).
PRELOAD = (
    "pydantic",
    "pydantic_settings",
    "anyio",
    "fast_depends",
    "faststream",
    "faststream.nats",
    "nats",
    "pymongo",
    "httpx",
    "fastapi",
    "starlette.applications",
    "uvicorn",
    "nx_27017",
)
# The environment the interpreter, the dynamic loader and the C library read as they start (not again in a fork: e.g.
# where `dlopen` looks for libnvidia-ml): a child whose values differ is started as a Python of its own.
INTERPRETER_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "GLIBC_TUNABLES")
INTERPRETER_PREFIXES = ("PYTHON", "LD_", "MALLOC_")
START_TIMEOUT_S = 30.0  # how long a fork may take to say its pid


class ForkServerError(RuntimeError):
    """The fork server could not start the process (the stack starts it as a Python of its own)."""


def interpreter_env(env: dict[str, str]) -> dict[str, str]:
    """What of `env` the interpreter reads at its start: all the server is given."""
    return {k: v for k, v in env.items() if k.startswith(INTERPRETER_PREFIXES) or k in INTERPRETER_KEYS}


# --- the stack's side -------------------------------------------------------------------------------------------


class ForkedProcess:
    """A process the fork server started, as the stack uses a `subprocess.Popen`."""

    def __init__(self, pid: int, conn: socket.socket, args: list[str], death_signal: int) -> None:
        self.pid = pid
        self.args = args
        self.death_signal = death_signal  # what ended it if the server died before telling its end
        self.returncode: int | None = None
        self._conn: socket.socket | None = conn
        self._buffer = b""
        self._lock = threading.Lock()
        self._started = stat[1] if (stat := _stat(pid)) else None

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                self._read(0.0)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                left = None if deadline is None else deadline - time.monotonic()
                if self.returncode is None:
                    self._read(0.1 if left is None else max(0.0, min(left, 0.1)))
                if self.returncode is not None:
                    return self.returncode
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self, timeout: float) -> None:
        """Read the exit status if it came within `timeout`; the server gone without one (its children had their
        signal), the process's end is seen in /proc."""
        if self._conn is None:  # the server is gone: the process ended once its pid is another's or nobody's
            if _ended(self.pid, self._started):
                self.returncode = -self.death_signal
            else:
                time.sleep(timeout)
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        data = self._conn.recv(64)
        self._buffer += data
        if b"\n" in self._buffer:
            line = self._buffer.split(b"\n", 1)[0].decode()
            self.returncode = int(line.split()[1]) if line.startswith("exit ") else -signal.SIGKILL
        if data and self.returncode is None:
            return
        self._conn.close()  # read: the server reaps it now
        self._conn = None


class ForkServer:
    """The fork server of one stack: started with the interpreter's environment of `env`, its output in `log`."""

    def __init__(self, env: dict[str, str], *, cwd: Path, log: Path) -> None:
        self.env = interpreter_env(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.stack.forkserver", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=cwd,
                start_new_session=True,  # Ctrl-C in `make run`'s terminal is the stack's to handle
            )
        theirs.close()
        self.control = ours
        self.lock = threading.Lock()

    def serves(self, argv: list[str], env: dict[str, str]) -> bool:
        """Whether `argv` is `python -m <module> ...` of this interpreter, with the interpreter's environment the
        server has, and the server is up."""
        return (
            len(argv) >= 3
            and argv[:2] == [sys.executable, "-m"]
            and interpreter_env(env) == self.env
            and self.process.poll() is None
        )

    def spawn(
        self, argv: list[str], *, env: dict[str, str], cwd: Path, umask: int, log: int, death_signal: int, name: str
    ) -> ForkedProcess:
        """Fork `argv` (`python -m module args...`) with its output to the file descriptor `log`. Two sockets: the
        child reads its request from one (the server never does), the server writes its exit status to the other."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        status, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                with self.lock:
                    socket.send_fds(self.control, [b"fork"], [theirs.fileno(), server_end.fileno(), log])
            except OSError as exc:  # the server is gone
                raise ForkServerError(f"the fork server is gone: {exc}") from exc
            finally:
                theirs.close()
                server_end.close()
            request = {
                "module": argv[2],
                "args": argv[3:],
                "env": env,
                "cwd": str(cwd),
                "umask": umask,
                "death_signal": int(death_signal),
                "name": name,
            }
            payload = json.dumps(request).encode()
            ours.settimeout(START_TIMEOUT_S)
            ours.sendall(len(payload).to_bytes(4, "big") + payload)
            line = _read_line(ours)
        except (OSError, ValueError) as exc:
            status.close()
            raise ForkServerError(f"no answer from the fork server: {exc}") from exc
        finally:
            ours.close()
        if not line.startswith("pid "):
            status.close()
            raise ForkServerError(f"the fork server could not start {argv[2]}: {line or 'no answer'}")
        return ForkedProcess(int(line[4:]), status, argv, int(death_signal))

    def stop(self, timeout_s: float = 5.0) -> None:
        """The server ends (its children, if any are left, get their signal)."""
        self.control.close()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(256)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def _stat(pid: int) -> tuple[str, str] | None:
    """The process's state and start time (fields 3 and 22 of /proc/PID/stat); None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], fields[19]


def _ended(pid: int, started: str | None) -> bool:
    """Whether the process that started at `started` has ended: gone, its pid another's, or a zombie left to a
    parent that may never reap it."""
    stat = _stat(pid)
    return stat is None or stat[0] == "Z" or stat[1] != started


# --- the server's side ------------------------------------------------------------------------------------------


def serve(control: socket.socket) -> dict[str, Any] | None:
    """Fork a child for each request until the stack closes `control`; return in a child with its request (None in
    the server once it ends)."""
    if threading.active_count() != 1:  # a fork copies one thread: a lock another held would stay held
        raise RuntimeError("the fork server must be single-threaded to fork")
    server = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket | None] = {}  # a child's socket to the stack; None: the stack let it go
    told: set[int] = set()  # children whose status the stack was sent and has not yet read
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, "control")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    while True:
        for key, _ in selector.select():
            if key.data == "control":
                message, fds, _, _ = socket.recv_fds(control, 16, 3)
                if not message:
                    return None  # the stack is gone, or done with us
                if len(fds) != 3:
                    _close([], fds)
                    continue
                request, conn, log = socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1]), fds[2]
                try:
                    pid = os.fork()
                except OSError as exc:
                    with contextlib.suppress(OSError):
                        request.sendall(f"error {exc}\n".encode())
                    _close([request, conn], [log])
                    continue
                if pid == 0:
                    selector.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    _close([control, conn, *(c for c in children.values() if c is not None)], [wake_r, wake_w])
                    return _become_child(request, log, server)
                _close([request], [log])
                children[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
            elif key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                _report_ends(children, told)
            else:  # the stack closed a child's socket: it has read its status (or let it go)
                _closed(key.data, children, told, selector)
                _report_ends(children, told)


def _closed(
    pid: int, children: dict[int, socket.socket | None], told: set[int], selector: selectors.BaseSelector
) -> None:
    """The stack's end of a child's socket is readable: closed (end of file, or reset when it closed with our status
    unread), the child is reaped if it ended, else reaped when it ends; anything else read is ignored."""
    closing = children.get(pid)
    if closing is None:
        return
    try:
        data = closing.recv(64)
    except OSError:
        data = b""
    if data:
        return
    selector.unregister(closing)
    closing.close()
    if pid in told:
        told.discard(pid)
        del children[pid]
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    else:
        children[pid] = None


def _report_ends(children: dict[int, socket.socket | None], told: set[int]) -> None:
    """Tell the stack of each child that ended (left unreaped until it read it); reap those it let go."""
    for pid, conn in list(children.items()):
        if pid in told:
            continue
        keep = conn is not None
        try:
            ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | (os.WNOWAIT if keep else 0))
        except ChildProcessError:  # reaped already (nothing else here reaps): ended, its status unknown
            code = -signal.SIGKILL
        else:
            if ended is None or ended.si_pid == 0:
                continue
            code = ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status
        if not keep:
            del children[pid]
            continue
        told.add(pid)  # told, or nobody left to tell: reaped once the stack's end closes
        with contextlib.suppress(OSError):
            conn.sendall(f"exit {code}\n".encode())  # type: ignore[union-attr]


def _close(sockets: Iterable[socket.socket], fds: Iterable[int]) -> None:
    for sock in sockets:
        sock.close()
    for fd in fds:
        os.close(fd)


def _become_child(conn: socket.socket, log: int, server: int) -> dict[str, Any]:
    """In the forked child: read the request, take its session, output, directory, umask and environment, say the
    pid. Whatever fails here ends the child with status 127 and says why in its log."""
    try:
        conn.settimeout(START_TIMEOUT_S)
        size = int.from_bytes(_read_exact(conn, 4), "big")
        request = json.loads(_read_exact(conn, size))
        os.setsid()
        die_with(server, int(request["death_signal"]))
        name_process(str(request["name"]))
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(request["cwd"])
        if request["umask"] >= 0:
            os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        conn.sendall(f"pid {os.getpid()}\n".encode())
        conn.close()
        return request
    except BaseException as exc:  # noqa: BLE001 - a child must never return into the server's loop
        with contextlib.suppress(Exception):
            os.write(2, f"trainmaster fork server: the child could not start: {exc!r}\n".encode())
        os._exit(127)


def _read_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the stack closed the request")
        data += chunk
    return data


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    gc.disable()  # what the imports leave is frozen whole: collections would otherwise copy each page they touch
    for name in PRELOAD:
        with contextlib.suppress(ImportError):  # an optional one (the embedded database's) may be absent
            importlib.import_module(name)
    gc.freeze()
    request = serve(control)
    gc.enable()
    if request is None:
        return
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
