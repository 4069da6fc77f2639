"""`python -m services.stack.database SOCKET [nx-27017 options]`: the embedded database on a Unix socket.

nx-27017 has no authentication, and a TCP port on loopback is open to every local user, tasks included. A socket
file (0600, in the 0700 data directory) is reachable only by the user running the stack; the services reach it
as `mongodb://<socket path, url-quoted>`, which PyMongo reads as a Unix socket (the name ends in `.sock`).
"""

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from nx_27017 import server
from nx_27017.nx_27017 import main as serve


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
    sys.argv = ["nx-27017", *options]
    serve()


if __name__ == "__main__":
    main()
