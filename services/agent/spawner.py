"""The agent's forking server of task shims (`shim.py --serve`): started once, it forks each task's shim.

A task's shim used to be a Python start of its own (`python -I -S shim.py`): ~75 ms of CPU a task on the 2-core VM
(its interpreter ~16 ms, its imports ~40 ms), as much again as the rest of the stack spent on a no-op job; a fork of
the server, whose imports are done, costs about a millisecond. What a shim does and may do is unchanged: the same
code, run as the same user with the same empty environment, a session of its own, its output on pipes the agent
made, its launch file read by itself.

The server is the shims' parent: their exit statuses come from it, in order after their pids. It dies with the agent
and a shim dies with it (parent-death signals), so no task outlives either; a server found gone (its socket closed)
ends the tasks it had forked as the agent's death would (each reads as killed, and the agent's end of a task kills
what is left of it), and the next launch starts a new one. A shim is killed through the server (`{"kill": pid}`):
only its parent knows whether that pid is still its unreaped child, never another process that reused it. One
server per event loop; where it cannot be started, a shim is started as before (`Spawner.start` raises, the caller
falls back).
"""

import asyncio
import atexit
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

log = logging.getLogger(__name__)

SHIM = Path(__file__).resolve().parent / "shim.py"
READ_LIMIT = 2**20  # a task's output stream buffer (as the shim's pipes had)


class SpawnerGone(OSError):
    """The forking server cannot be reached (it could not start, or it died)."""


class ShimProcess:
    """A shim forked by the server, read as `asyncio.subprocess.Process` is: `pid`, `returncode`, `stdout`,
    `stderr`, `wait()`."""

    def __init__(self, pid: int, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader) -> None:
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.returncode: int | None = None
        self._ended = asyncio.Event()
        self._transports: list[asyncio.BaseTransport] = []
        self._closed: list[asyncio.Event] = []  # one a pipe, set once its write ends are all closed

    def _exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._ended.set()

    async def wait(self) -> int:
        """Its exit status, once it exited and its output pipes closed (as `asyncio.subprocess.Process.wait`: a
        process of the task still holding them, saving after its SIGTERM, say, is waited for too)."""
        await self._ended.wait()
        for closed in self._closed:
            await closed.wait()
        assert self.returncode is not None
        return self.returncode

    def close(self) -> None:
        """Close the agent's ends of its output pipes (once nothing more is read from them)."""
        for transport in self._transports:
            transport.close()


class Spawner:
    """One event loop's forking server and what it forked (`start`); started at the first `start`, again after it
    was found gone."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._server: subprocess.Popen[bytes] | None = None
        self._next_id = 0
        self._asked: dict[int, asyncio.Future[int]] = {}  # request id -> the shim's pid
        self._live: dict[int, ShimProcess] = {}  # pid -> shim, until its exit status came
        self._buffer: dict[int, int] = {}  # pid -> exit status that came before its ShimProcess was made
        self._starting = asyncio.Lock()
        self._abandoned: set[int] = set()  # request ids whose launch was cancelled before the answer came
        self._unwatched: set[int] = set()  # the pids of their shims, killed, until their end is said
        self._sending: set[asyncio.Task] = set()  # kills waiting for room on the socket

    async def start(self, launch: Path, *, cwd: Path) -> ShimProcess:
        """Fork the shim of launch file `launch` in `cwd`, its input /dev/null and its output on new pipes;
        SpawnerGone where the server cannot be reached (the caller starts the shim itself)."""
        sock = await self._running()
        loop = asyncio.get_running_loop()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        ident = self._next_id = self._next_id + 1
        answer: asyncio.Future[int] = loop.create_future()
        self._asked[ident] = answer
        sent = False
        try:
            request = json.dumps({"id": ident, "launch": str(launch), "cwd": str(cwd)}).encode()
            try:
                await _send(sock, request, [null, out_w, err_w])
                sent = True
            except OSError as exc:
                self._gone(f"could not be asked: {exc!r}")
                raise SpawnerGone(f"the shim server could not be asked: {exc!r}") from exc
            finally:
                for fd in (null, out_w, err_w):  # the server received copies; the shim holds the write ends
                    os.close(fd)
            pid = await answer
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            if sent:
                self._abandon(ident, answer)
            raise
        shim = ShimProcess(pid, *(asyncio.StreamReader(limit=READ_LIMIT, loop=loop) for _ in range(2)))
        for fd, reader in ((out_r, shim.stdout), (err_r, shim.stderr)):
            transport, protocol = await loop.connect_read_pipe(partial(_Pipe, reader), os.fdopen(fd, "rb", 0))
            shim._transports.append(transport)
            shim._closed.append(protocol.closed)
        if (code := self._buffer.pop(pid, None)) is not None:
            shim._exited(code)
        else:
            self._live[pid] = shim
        return shim

    def _abandon(self, ident: int, answer: "asyncio.Future[int]") -> None:
        """A launch cancelled once its request was sent: its shim, forked or about to be, is killed (it has started
        nothing yet) and its end is not waited for."""
        if self._asked.pop(ident, None) is not None:  # not answered yet: killed when the answer comes
            self._abandoned.add(ident)
        elif answer.done() and not answer.cancelled() and answer.exception() is None:  # answered, not yet taken
            pid = answer.result()
            if self._buffer.pop(pid, None) is None:  # not ended yet
                self._unwatched.add(pid)
                self._kill(pid)

    def _kill(self, pid: int) -> None:
        """SIGKILL a shim and, once it has made it, its process group: by the server, its parent, which alone knows
        whether that pid is still its child (here, once it was reaped, the pid may name another process)."""
        if self._sock is None:
            return  # the server is gone, and its shims with it
        request = json.dumps({"kill": pid}).encode()
        try:
            self._sock.send(request)
        except BlockingIOError:  # a full socket: sent once it can take it
            sending = asyncio.get_running_loop().create_task(_send(self._sock, request, []))
            self._sending.add(sending)
            sending.add_done_callback(self._sending.discard)
        except OSError as exc:
            self._gone(f"could not be asked: {exc!r}")

    @property
    def server_pid(self) -> int | None:
        return self._server.pid if self._server is not None else None

    async def warm(self) -> None:
        """Start the server now (a Python start), not at the first task's launch."""
        await self._running()

    async def _running(self) -> socket.socket:
        async with self._starting:
            if self._sock is None:
                await self._start_server()
            assert self._sock is not None
            return self._sock

    async def _start_server(self) -> None:
        """Started from the loop's thread (the server's parent-death signal follows the thread that forked it)."""
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:
            raise SpawnerGone(f"no socket pair for the shim server: {exc!r}") from exc
        try:
            self._server = subprocess.Popen(
                [sys.executable, "-I", "-S", str(SHIM), "--serve", str(theirs.fileno()), str(os.getpid())],
                pass_fds=[theirs.fileno()],
                env={"PATH": os.defpath},
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except OSError as exc:
            ours.close()
            raise SpawnerGone(f"the shim server could not be started: {exc!r}") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        asyncio.get_running_loop().add_reader(ours.fileno(), self._read, ours)

    def _read(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                return
            except OSError as exc:
                self._gone(f"its socket failed: {exc!r}")
                return
            if not data:
                self._gone("it ended")
                return
            self._answer(data.decode(errors="replace").split())

    def _answer(self, words: list[str]) -> None:
        kind, rest = (words[0], words[1:]) if words else ("", [])
        if kind == "started" and len(rest) == 2:
            ident, pid = int(rest[0]), int(rest[1])
            future = self._asked.pop(ident, None)
            if ident in self._abandoned:  # its launch was cancelled: forked a moment ago, it has started nothing
                self._abandoned.discard(ident)
                self._unwatched.add(pid)
                self._kill(pid)
            elif future is not None and not future.done():
                future.set_result(pid)
        elif kind == "exited" and len(rest) == 2:
            pid, code = int(rest[0]), int(rest[1])
            shim = self._live.pop(pid, None)
            if shim is not None:
                shim._exited(code)
            elif pid in self._unwatched:
                self._unwatched.discard(pid)
            else:  # its pid's answer is still on its way to `start`
                self._buffer[pid] = code
        elif kind == "refused" and rest:
            future = self._asked.pop(int(rest[0]), None)
            if future is not None and not future.done():
                future.set_exception(SpawnerGone(f"the shim server refused the launch: {' '.join(rest[1:])}"))
        else:
            log.warning("the shim server said something unexpected: %r", " ".join(words)[:200])

    def _gone(self, why: str, *, expected: bool = False) -> None:
        """The server is gone: its shims died with it (each reads as killed), the launches waiting fail."""
        if not expected:
            log.warning("the shim server is gone (%s): its tasks end as killed; the next launch starts a new one", why)
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                asyncio.get_running_loop().remove_reader(sock.fileno())
            except (RuntimeError, ValueError):
                pass
            sock.close()
        for shim in self._live.values():
            shim._exited(-signal.SIGKILL)
        self._live.clear()
        self._buffer.clear()
        for future in self._asked.values():
            if not future.done():
                future.set_exception(SpawnerGone(f"the shim server is gone ({why})"))
        self._asked.clear()
        self._abandoned.clear()
        self._unwatched.clear()
        self._end_server()

    def stop(self) -> None:
        """End the server (its shims die with it)."""
        if self._sock is not None:
            self._gone("stopped", expected=True)

    def abandon(self) -> None:
        """End the server of a loop that is closed (or of a process that is ending): its socket closed, the server
        killed and reaped, nothing of the loop touched (its futures and transports went with it)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        self._end_server()

    def _end_server(self) -> None:
        if self._server is not None:
            self._server.kill()  # nothing when it has ended already
            self._server.wait()
            self._server = None


async def _send(sock: socket.socket, request: bytes, fds: list[int]) -> None:
    """One request with its descriptors, once the socket can take it (a full buffer waits, never fails)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            if fds:
                socket.send_fds(sock, [request], fds)
            else:
                sock.send(request)
            return
        except BlockingIOError:
            writable: asyncio.Future[None] = loop.create_future()
            loop.add_writer(sock.fileno(), _settle, writable)
            try:
                await writable
            finally:
                loop.remove_writer(sock.fileno())


class _Pipe(asyncio.StreamReaderProtocol):
    """A task's output pipe, read into `reader`; `closed` once no process holds its write end."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        super().__init__(reader)
        self.closed = asyncio.Event()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.closed.set()


def _settle(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


_SPAWNERS: dict[asyncio.AbstractEventLoop, Spawner] = {}
_SPAWNERS_LOCK = threading.Lock()  # loops of several threads may ask at once


def spawner() -> Spawner:
    """The running event loop's forking server (the servers of loops closed since are ended: an agent has one loop,
    a test process one a test)."""
    loop = asyncio.get_running_loop()
    with _SPAWNERS_LOCK:
        closed = [_SPAWNERS.pop(other) for other in list(_SPAWNERS) if other.is_closed()]
        found = _SPAWNERS.get(loop)
        if found is None:
            found = _SPAWNERS[loop] = Spawner()
    for ended in closed:
        ended.abandon()
    return found


@atexit.register
def _end_servers() -> None:
    """At the process's end its forking servers end too, not only by their parent-death signal once it is gone."""
    with _SPAWNERS_LOCK:
        ending = list(_SPAWNERS.values())
        _SPAWNERS.clear()
    for server in ending:
        server.abandon()
