"""`python -m services.stack.database SOCKET [nx-27017 options]`: the embedded database on a Unix socket.

nx-27017 has no authentication, and a TCP port on loopback is open to every local user, tasks included. A socket
file (0600, in the 0700 data directory) is reachable only by the user running the stack; the services reach it
as `mongodb://<socket path, url-quoted>`, which PyMongo reads as a Unix socket (the name ends in `.sock`).

Each command runs on the server's event loop, not on a worker thread (`asyncio.to_thread` in nx-27017's server):
its handler holds one lock per database for every command, and each service's server holds one database, so the
threads ran one command at a time all the same; each hand-off to a thread and back cost about as much CPU as the
command's SQL (half of each server's CPU under `bench.submit`).
"""

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from nx_27017 import server
from nx_27017.nx_27017 import main as serve

T = TypeVar("T")


async def on_loop(func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`asyncio.to_thread`'s call, made on the loop: the command's handler runs where its message was read."""
    return func(*args, **kwargs)


def commands_on_loop() -> None:
    """nx-27017's server runs each command with `on_loop` (its module's `asyncio.to_thread`, nothing else of
    asyncio changed)."""
    server.asyncio = SimpleNamespace(**{**vars(asyncio), "to_thread": on_loop})


def on_socket(path: Path) -> Callable[..., Awaitable[None]]:
    """nx-27017's asyncio server, listening on `path` instead of a host and port."""

    async def run_server(host: str, port: int, handler: Any) -> None:
        path.unlink(missing_ok=True)  # what a killed server left
        listener = await asyncio.start_unix_server(lambda r, w: server.handle_client(r, w, handler), path=str(path))
        os.chmod(path, 0o600)
        async with listener:
            await listener.serve_forever()

    return run_server


def main() -> None:
    path, options = Path(sys.argv[1]), sys.argv[2:]
    server.run_server = on_socket(path)
    commands_on_loop()
    sys.argv = ["nx-27017", *options]
    serve()


if __name__ == "__main__":
    main()
