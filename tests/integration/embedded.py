"""The stack's embedded database (`services.stack.database`) started alone for a test."""

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote_plus

from services.stack.processes import wait_for_socket


@contextlib.contextmanager
def embedded_database(folder: Path) -> Iterator[str]:
    """A server on a Unix socket in `folder` (its data there too), killed at the end: its `mongodb://` URL."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock = folder / "mongo.sock"
    server = subprocess.Popen(
        [sys.executable, "-m", "services.stack.database", str(sock), "--data-dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_socket(sock)
        yield "mongodb://" + quote_plus(str(sock))
    finally:
        server.kill()
        server.wait()
