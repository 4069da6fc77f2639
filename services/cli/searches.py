"""`trainmaster search`: create, list, show and stop hyperparameter searches."""
import argparse

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
    return [search["metadata"]["id"], search["metadata"]["name"], search["status"]["phase"],
            search["spec"]["pruner"], f"{done}/{search['spec']['max_trials']}", value(best.get("value")),
            render.ago(search["metadata"]["create_time"])]


def detail(search: dict) -> str:
    status, spec = search["status"], search["spec"]
    names = sorted(spec["space"])
    lines = [f"{search['metadata']['name']} ({search['metadata']['id']}): {status['phase']}"
             f"{' - ' + status['reason'] if status.get('reason') else ''}",
             f"objective {spec['objective']['mode']} {spec['objective']['metric']}, pruner {spec['pruner']}, "
             f"parallelism {spec['parallelism']}, {status['gpu_hours']:.3f} GPU-hours",
             *([f"note: {status['message']}"] if status.get("message") else [])]
    best = status.get("best")
    if best:
        lines.append(f"best: trial {best['trial']} = {value(best['value'])} with "
                     + ", ".join(f"{k}={value(v)}" for k, v in sorted(best["parameters"].items())))
    rows = [[t["trial"], t["job_id"], t["state"], value(t.get("value")), value(t.get("step")),
             *[value(t["parameters"].get(n)) for n in names], t.get("reason", "")[:60]] for t in search["trials"]]
    lines.append(render.table(("trial", "job", "state", "value", "step", *names, "reason"), rows))
    return "\n".join(lines)


def create(args: argparse.Namespace, api: Api) -> int:
    body = jobfile.read(args.file)
    for key in ("name", "pruner", "max_trials", "parallelism"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    search = api.call("POST", path(args, api), json=body)
    return out(args, search, search["metadata"]["id"])


def list_searches(args: argparse.Namespace, api: Api) -> int:
    answer = api.call("GET", path(args, api), params={"limit": args.limit, "offset": args.offset})
    return out(args, answer, render.table(("id", "name", "phase", "pruner", "trials", "best", "created"),
                                          [summary_row(s) for s in answer["items"]]))


def get(args: argparse.Namespace, api: Api) -> int:
    search = api.call("GET", path(args, api, args.search_id))
    return out(args, search, detail(search))


def stop(args: argparse.Namespace, api: Api) -> int:
    search = api.call("POST", path(args, api, args.search_id) + "/actions", json={"action_type": "stop"})
    return out(args, search, f"stopping {args.search_id}: no new trial starts, running ones are terminated")


def add_parser(sub: argparse._SubParsersAction, shared: argparse.ArgumentParser) -> None:
    """The `search` command and its actions, beside the other commands."""
    help_ = "hyperparameter searches: create from a YAML/JSON file, list, get, stop"
    actions = sub.add_parser("search", help=help_, description=help_).add_subparsers(
        dest="search_command", required=True, metavar="ACTION")

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
    ls = action("list", list_searches, "the project's searches")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--offset", type=int, default=0)
    action("get", get, "a search's trials, their parameters, values and states, and the best").add_argument(
        "search_id")
    action("stop", stop, "stop a search: no new trial, running trials terminated").add_argument("search_id")
