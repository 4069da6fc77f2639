import sys
from typing import Any

import uvicorn
from pydantic import ValidationError
from uvicorn.config import STARTUP_FAILURE

from services.submitter.app import SubmitterSettings, create_app
from services.submitter.connections import HeadTimedProtocol, QuietServer

# An idle keep-alive connection is closed by the client first: uvicorn's default (5 s) equals httpx's (the CLI's)
# keep-alive expiry, so a request sent on a connection just as the server closed it failed with a read error.
KEEP_ALIVE_S = 75


def server_options(settings: SubmitterSettings) -> dict[str, Any]:
    """uvicorn's options: idle connections kept `KEEP_ALIVE_S`, one that sends no whole request head in time closed
    (`connections.REQUEST_HEAD_S`), and no more held at once than the setting (each one costs a descriptor; beyond
    it a request is answered 503)."""
    return {
        "host": settings.api_host,
        "port": settings.api_port,
        "log_level": "warning",
        "timeout_keep_alive": KEEP_ALIVE_S,
        "limit_concurrency": settings.api_max_connections,
        "http": HeadTimedProtocol,
    }


if __name__ == "__main__":
    try:
        settings = SubmitterSettings()
    except ValidationError as exc:  # e.g. an admin token too short: say so and stop, before anything listens
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()
        )
        print(f"trainmaster submitter: invalid settings: {problems}", file=sys.stderr)
        sys.exit(2)
    server = QuietServer(uvicorn.Config(create_app(settings), **server_options(settings)))
    server.run()
    if not server.started:  # as `uvicorn.run`: it could not start (the port taken, say)
        sys.exit(STARTUP_FAILURE)
