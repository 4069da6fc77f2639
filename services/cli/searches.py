"""`trainmaster search`: create, list, show and stop hyperparameter searches."""

import argparse
import os
import sys
import time

from services.cli import jobfile, render
from services.cli.client import Api
from services.cli.commands import out, project


def path(args: argparse.Namespace, api: Api, search_id: str = "") -> str:
    base = f"/v2/{project(args, api)}/searches"
    return f"{base}/{search_id}" if search_id else base


def value(v) -> str:
    return "-" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def summary_row(search: dict) -> list[str]:
    best = search["status"].get("best") or {}
    done = sum(1 for t in search["trials"] if t["state"] != "Running")
    return [
        search["metadata"]["id"],
        search["metadata"]["name"],
        search["status"]["phase"],
        search["spec"]["pruner"],
        f"{done}/{search['spec']['max_trials']}",
        value(best.get("value")),
        render.ago(search["metadata"]["create_time"]),
    ]


def detail(search: dict) -> str:
    status, spec = search["status"], search["spec"]
    names = sorted(spec["space"])
    lines = [
        f"{search['metadata']['name']} ({search['metadata']['id']}): {status['phase']}"
        f"{' - ' + status['reason'] if status.get('reason') else ''}",
        f"objective {spec['objective']['mode']} {spec['objective']['metric']}, pruner {spec['pruner']}, "
        f"parallelism {spec['parallelism']}, {status['gpu_hours']:.3f} GPU-hours",
        *([f"note: {status['message']}"] if status.get("message") else []),
    ]
    best = status.get("best")
    if best:
        lines.append(
            f"best: trial {best['trial']} = {value(best['value'])} with "
            + ", ".join(f"{k}={value(v)}" for k, v in sorted(best["parameters"].items()))
        )
    rows = [
        [
            t["trial"],
            t["job_id"],
            t["state"],
            value(t.get("value")),
            value(t.get("step")),
            *[value(t["parameters"].get(n)) for n in names],
            t.get("reason", "")[:60],
        ]
        for t in search["trials"]
    ]
    lines.append(render.table(("trial", "job", "state", "value", "step", *names, "reason"), rows))
    return "\n".join(lines)


def create(args: argparse.Namespace, api: Api) -> int:
    body = jobfile.read(args.file)
    for key in ("name", "pruner", "max_trials", "parallelism"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.secret:  # into the template: every trial's task gets them
        algorithm = body.setdefault("template", {}).setdefault("algorithm", {})
        algorithm["secrets"] = {**algorithm.get("secrets", {}), **jobfile.secrets_from(args.secret, dict(os.environ))}
    search = api.call("POST", path(args, api), json=body)
    if not args.follow:
        return out(args, search, created(search))
    print(render.safe(created(search).splitlines()[0]), file=sys.stderr, flush=True)
    search = follow(api, path(args, api, search["metadata"]["id"]))
    return out(args, search, detail(search))


def created(search: dict) -> str:
    """What a new search will do, and how to follow it."""
    spec, meta = search["spec"], search["metadata"]
    space = ", ".join(sorted(spec["space"]))
    return (
        f"search {meta['name']} ({meta['id']}): up to {spec['max_trials']} trials over {space}, "
        f"{spec['parallelism']} at a time, {spec['objective']['mode']} {spec['objective']['metric']}, "
        f"pruner {spec['pruner']}\nfollow it: trainmaster search get --follow {meta['id']}"
    )


def progress_line(search: dict) -> str:
    """`sweep Running: 2 running, 3 completed, 1 pruned of 6; best 0.0317 (trial 4)`."""
    states: dict[str, int] = {}
    for trial in search["trials"]:
        states[trial["state"].lower()] = states.get(trial["state"].lower(), 0) + 1
    best = search["status"].get("best")
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "no trial yet"
    return f"{search['metadata']['name']} {search['status']['phase']}: {counts} of {search['spec']['max_trials']}" + (
        f"; best {value(best['value'])} (trial {best['trial']})" if best else ""
    )


POLL_S = 2.0


def follow(api: Api, search_path: str, *, sleep=time.sleep) -> dict:
    """Poll until the search ends, a line on stderr whenever its trials change state; the last answer."""
    last = ""
    while True:
        search = api.call("GET", search_path)
        line = progress_line(search)
        if line != last:
            print(render.safe(line), file=sys.stderr, flush=True)
            last = line
        if search["status"]["phase"] != "Running":
            return search
        sleep(POLL_S)


def list_searches(args: argparse.Namespace, api: Api) -> int:
    answer = api.call("GET", path(args, api), params={"limit": args.limit, "offset": args.offset})
    return out(
        args,
        answer,
        render.table(
            ("id", "name", "phase", "pruner", "trials", "best", "created"), [summary_row(s) for s in answer["items"]]
        ),
    )


def get(args: argparse.Namespace, api: Api) -> int:
    search_path = path(args, api, args.search_id)
    search = follow(api, search_path) if args.follow else api.call("GET", search_path)
    return out(args, search, detail(search))


def stop(args: argparse.Namespace, api: Api) -> int:
    search = api.call("POST", path(args, api, args.search_id) + "/actions", json={"action_type": "stop"})
    return out(args, search, f"stopping {args.search_id}: no new trial starts, running ones are terminated")


def add_parser(sub: argparse._SubParsersAction, shared: argparse.ArgumentParser) -> None:
    """The `search` command and its actions, beside the other commands."""
    help_ = "hyperparameter searches: create from a YAML/JSON file, list, get, stop"
    actions = sub.add_parser("search", help=help_, description=help_).add_subparsers(
        dest="search_command", required=True, metavar="ACTION"
    )

    def action(name: str, handler, text: str) -> argparse.ArgumentParser:
        p = actions.add_parser(name, parents=[shared], help=text, description=text)
        p.set_defaults(handler=handler)
        return p

    c = action("create", create, "start a search from a file holding the POST /v2/{project}/searches body")
    c.add_argument("-f", "--file", required=True, help="YAML or JSON ('-' reads stdin)")
    c.add_argument("--name")
    c.add_argument("--pruner", choices=["none", "median", "hyperband", "predicted"])
    c.add_argument("--max-trials", type=int)
    c.add_argument("--parallelism", type=int)
    c.add_argument("--follow", action="store_true", help="then follow it to its end, as search get --follow")
    c.add_argument(
        "--secret",
        action="append",
        metavar="NAME",
        help="a secret for every trial's task, its value taken from your environment (never on the command line)",
    )
    ls = action("list", list_searches, "the project's searches")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--offset", type=int, default=0)
    g = action("get", get, "a search's trials, their parameters, values and states, and the best")
    g.add_argument("search_id")
    g.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="until the search ends, a line each time a trial changes state (on stderr), then the table",
    )
    action("stop", stop, "stop a search: no new trial, running trials terminated").add_argument("search_id")
