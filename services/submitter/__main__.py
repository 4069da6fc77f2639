import contextlib
import sys
from typing import Any

import uvicorn
from pydantic import ValidationError
from uvicorn.config import STARTUP_FAILURE

from shared import bus
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


def serve(app: Any, options: dict[str, Any]) -> None:
    """Run the API until a signal stops it, as `uvicorn.run` would (`QuietServer` for its server): a SIGINT ends it
    cleanly (uvicorn raises the signal it caught again once it stopped), one that could not start exits 3."""
    server = QuietServer(uvicorn.Config(app, **options))
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:  # the port taken, say
        sys.exit(STARTUP_FAILURE)


if __name__ == "__main__":
    try:
        settings = SubmitterSettings()
    except ValidationError as exc:  # e.g. an admin token too short: say so and stop, before anything listens
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()
        )
        print(f"trainmaster submitter: invalid settings: {problems}", file=sys.stderr)
        sys.exit(2)
    bus.EXIT_WHEN_CLOSED = True  # a bus that closes the connection for good ends the process (`BusLink.closed`)
    serve(create_app(settings), server_options(settings))
