"""`trainmaster` (or `python -m services.cli`): submit, list, follow and manage training jobs."""

import argparse
import os
import sys

import httpx

from services.cli import commands, render, searches, tokens, webhooks
from services.cli.client import EXIT_CONFIG, EXIT_UNAVAILABLE, EXIT_USAGE, Api, CliError
from services.cli.settings import config_file, load

EPILOG = f"""\
server and token: --url/--token, else TRAINMASTER_URL/TRAINMASTER_TOKEN/TRAINMASTER_PROJECT,
else url/token/project in {config_file()}.

exit codes: 0 done; following a job (logs -f, get --watch, submit --follow): the job's failed
task's exit code (1 if it has none), 143 if it was terminated; 2 wrong usage or job file;
65 the API refused the request; 69 the server is unreachable or failed; 77 token missing,
invalid or without permission; 78 no token or project configured; 141 the reader of the output
went away (`trainmaster list | head -1`). API errors print "error <error_code>: <error_msg>" on stderr."""
EXIT_PIPE = 141  # as a shell reports a process ended by SIGPIPE


def common() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--url", default=argparse.SUPPRESS, help="API base URL")
    parser.add_argument("--token", default=argparse.SUPPRESS, help="bearer token")
    parser.add_argument("-p", "--project", default=argparse.SUPPRESS, help="project of the jobs")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON")
    return parser


def parser() -> argparse.ArgumentParser:
    shared = common()
    root = argparse.ArgumentParser(
        prog="trainmaster",
        parents=[shared],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run training jobs on trainmaster's hybrid GPU fleet.",
    )
    sub = root.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[shared], help=help_, description=help_)
        p.set_defaults(handler=handler)
        return p

    def job_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("-f", "--file", help="YAML or JSON job file; flags override its fields ('-' reads stdin)")
        p.add_argument("--name")
        p.add_argument("--description")
        p.add_argument("--command", help="run with /bin/sh -c")
        p.add_argument("--gpus", type=int, help="GPUs per node")
        p.add_argument("--nodes", type=int, help="nodes (one rank each)")
        p.add_argument("--min-gpu-memory-gb", type=float)
        p.add_argument("--cpus", type=float)
        p.add_argument("--memory-gb", type=float)
        p.add_argument("--allowed", choices=["local", "cloud", "any"])
        p.add_argument("--priority", choices=["time", "cost"])
        p.add_argument("--expected-duration", type=int, metavar="SECONDS")
        p.add_argument("--max-duration", type=int, metavar="SECONDS")
        p.add_argument("--param", action="append", metavar="NAME=VALUE")
        p.add_argument("--env", action="append", metavar="NAME=VALUE")
        p.add_argument(
            "--secret",
            action="append",
            metavar="NAME",
            help="a secret for the task's environment, its value taken from yours (never on the command line); "
            "never shown back, masked in the job's output",
        )
        p.add_argument("--metric", action="append", metavar="NAME:REGEX[:min|max[:TARGET]]")

    s = command("submit", commands.submit, "submit a job from flags and/or a YAML job file (the request body)")
    job_flags(s)
    s.add_argument("--follow", action="store_true", help="then follow its output to the end (exit = the job's)")
    job_flags(
        command(
            "estimate",
            commands.estimate,
            "where a job could run, how long and at what cost (a dry run: nothing is created)",
        )
    )

    ls = command("list", commands.list_jobs, "list the project's jobs")
    ls.add_argument("--phase", action="append", help="only jobs in this phase (repeatable)")
    ls.add_argument("--user", help="only this user's jobs")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--offset", type=int, default=0)

    g = command("get", commands.get, "show a job")
    g.add_argument("job_id")
    g.add_argument("-w", "--watch", action="store_true", help="a live progress bar with the ETA until it ends")

    t = command("top", commands.top, "the project's running jobs with their GPUs' utilisation and memory now")
    t.add_argument("--limit", type=int, default=20)

    lg = command("logs", commands.logs, "print a job's output")
    lg.add_argument("job_id")
    lg.add_argument("-f", "--follow", action="store_true", help="until the job ends (exit = the job's)")
    lg.add_argument("--task", default="worker-0", help="worker-N of a multi-node job")
    lg.add_argument("--progress", action="store_true", help="a progress bar on stderr even when it is not a terminal")
    lg.add_argument("--no-progress", action="store_true", help="no progress bar on stderr while following")
    lg.add_argument(
        "--raw",
        action="store_true",
        help="the output as the job printed it, escape sequences included, even to a terminal (to a file or a "
        "pipe it always is)",
    )

    for name, handler, help_ in (
        ("terminate", commands.act("terminate"), "terminate a job"),
        ("migrate", commands.act("migrate"), "move a running job to another node"),
        ("delete", commands.delete, "delete a finished job"),
    ):
        command(name, handler, help_).add_argument("job_id")

    command("nodes", commands.nodes, "the fleet: kind, GPUs, price, state, jobs")
    tokens.add_parser(sub, shared)
    searches.add_parser(sub, shared)
    webhooks.add_parser(sub, shared)
    u = command("usage", commands.usage, "usage and cost by user and node kind")
    u.add_argument("--from", dest="start", help="ISO-8601 start")
    u.add_argument("--to", dest="end", help="ISO-8601 end")
    q = command("quota", commands.quota, "the project's quotas and month to date; give limits to set them (admin)")
    q.add_argument("--max-gpus", type=int)
    q.add_argument("--gpu-hours", type=float, help="GPU-hours per month")
    q.add_argument("--budget", type=float, help="dollars per month")
    q.add_argument("--user", help="set this user's limits instead of the project's")
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.json = getattr(args, "json", False)
    try:
        args.settings = load(
            url=getattr(args, "url", None), token=getattr(args, "token", None), project=getattr(args, "project", None)
        )
        if not args.settings.token:
            raise CliError(
                f'no token: give --token, set TRAINMASTER_TOKEN or put token = "..." in {config_file()}',
                exit_code=EXIT_CONFIG,
            )
        code = args.handler(
            args, Api(url=args.settings.url, token=args.settings.token, handover_s=args.settings.handover_s)
        )
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return code
    except CliError as exc:
        return complain(("error " + exc.error_code if exc.error_code else "error") + ": " + exc.message, exc.exit_code)
    except httpx.InvalidURL as exc:
        return complain(f"error: invalid API URL: {exc}", EXIT_USAGE)
    except httpx.HTTPError as exc:
        return complain(f"error: {exc}", EXIT_UNAVAILABLE)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit stays quiet
        return EXIT_PIPE
    except KeyboardInterrupt:
        return 130


def complain(text: str, code: int) -> int:
    try:
        print(render.safe(text), file=sys.stderr)
    except BrokenPipeError:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
