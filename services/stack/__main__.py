"""`make run`: the whole stack in the foreground until Ctrl-C."""

import signal
import sys
import time
from pathlib import Path

from services.stack.processes import SERVICES, Stack, StackSettings
from services.submitter.auth import check_admin_token


def databases(stack: Stack) -> str:
    """Where the services' databases are: the external server, else a server per service in the data directory."""
    if stack.settings.mongo_url:
        return f"{stack.settings.mongo_url} (a database per service)"
    return f"a server per service ({', '.join(SERVICES)}) in {stack.data_dir / 'db'}"


def main() -> None:
    stack = Stack(StackSettings())
    try:
        check_admin_token(stack.settings.admin_token)  # the submitter would refuse it too, less visibly
    except ValueError as exc:
        print(f"trainmaster: {exc}", file=sys.stderr)
        sys.exit(2)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        stack.start_all()
    except Exception as exc:
        print(f"trainmaster: could not start: {exc} (logs in {stack.data_dir / 'logs'})", file=sys.stderr)
        stack.stop_all()
        sys.exit(1)
    token_file = stack.data_dir / "admin-token"
    print(
        f"trainmaster is up: API {stack.api_url} (docs at {stack.api_url}/docs), NATS {stack.nats_url}, "
        f"databases {databases(stack)}\n  nodes: {', '.join(stack.node_ids())}\n"
        f"  admin token: {'TRAINMASTER_ADMIN_TOKEN' if stack.settings.admin_token else token_file}\n"
        f"  bus credentials (one per process; the admin's for your own tools): {stack.data_dir / 'bus' / 'creds'}\n"
        f"  logs: {stack.data_dir / 'logs'}\n"
        f"  the CLI: `source {Path(sys.prefix) / 'bin' / 'activate'}` puts `trainmaster` on the PATH; "
        f"portal: {stack.api_url}/ui/\n  Ctrl-C stops everything.",
        flush=True,
    )
    restarted: dict[str, float] = {}
    while not stopping:  # the supervisor: what exits is started again (a replica that lost its lease, a crash)
        for name, again in stack.restart_dead(restarted):
            log = stack.data_dir / "logs" / f"{name}.log"
            print(f"trainmaster: {name} exited{', started again' if again else ''} (see {log})", file=sys.stderr)
        time.sleep(0.5)
    print("trainmaster: stopping…", flush=True)
    stack.stop_all()


if __name__ == "__main__":
    main()
