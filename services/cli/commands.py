"""One function per command: call the API, print a table (or the JSON with --json), return the exit code."""

import argparse
import sys
from typing import Any

from services.cli import follow, jobfile, render
from services.cli.client import EXIT_CONFIG, Api, CliError


def out(args: argparse.Namespace, value: Any, text: str) -> int:
    print(render.dumps(value) if args.json else render.safe(text))
    return 0


def project(args: argparse.Namespace, api: Api) -> str:
    """--project, TRAINMASTER_PROJECT or the config file; else the token's only project."""
    if args.settings.project:
        return args.settings.project
    me = api.call("GET", "/v2/me")
    if len(me["projects"]) == 1:
        return me["projects"][0]
    raise CliError(
        f"say which project (--project or TRAINMASTER_PROJECT); {me['user_name']} may use: "
        f"{', '.join(me['projects']) or 'any (admin)'}",
        exit_code=EXIT_CONFIG,
    )


def jobs_path(args: argparse.Namespace, api: Api, job_id: str = "") -> str:
    path = f"/v2/{project(args, api)}/training-jobs"
    return f"{path}/{job_id}" if job_id else path


def submit(args: argparse.Namespace, api: Api) -> int:
    job = api.call("POST", jobs_path(args, api), json=jobfile.body(args))
    if args.follow:
        out(args, job, f"submitted {job['metadata']['name']}: {job['metadata']['id']}")
        return follow.logs(
            api, jobs_path(args, api, job["metadata"]["id"]), task="worker-0", progress=sys.stderr.isatty()
        )
    return out(args, job, job["metadata"]["id"])


def list_jobs(args: argparse.Namespace, api: Api) -> int:
    params = {"offset": args.offset, "limit": args.limit, "phase": args.phase or []}
    page = api.call("GET", jobs_path(args, api), params=params)
    items = [j for j in page["items"] if not args.user or j["metadata"]["user_name"] == args.user]
    text = render.table(render.JOB_HEADERS, [render.job_row(j) for j in items])
    more = page["total"] - page["offset"] - page["count"]
    if more > 0:
        text += f"\n({more} more; use --offset {page['offset'] + page['count']})"
    return out(args, {**page, "items": items, "count": len(items)} if args.user else page, text)


def get(args: argparse.Namespace, api: Api) -> int:
    path = jobs_path(args, api, args.job_id)
    if args.watch and not args.json:
        return follow.watch(api, path)
    job = api.call("GET", path)
    return out(args, job, job if args.json else render.job_detail(job, gpu_now(api, path)))


def gpu_now(api: Api, path: str) -> dict[str, float]:
    """A job's GPU figures now (its latest telemetry); none when they cannot be read."""
    try:
        return render.gpu_now(api.call("GET", f"{path}/metrics", params={"max_points": 1}))
    except CliError:
        return {}


def top(args: argparse.Namespace, api: Api) -> int:
    """The project's running jobs with their GPUs' utilisation and memory now."""
    page = api.call("GET", jobs_path(args, api), params={"phase": ["Running"], "limit": args.limit})
    rows = [(job, gpu_now(api, jobs_path(args, api, job["metadata"]["id"]))) for job in page["items"]]
    return out(
        args,
        [{"job_id": job["metadata"]["id"], "gpu": now} for job, now in rows],
        render.table(render.TOP_HEADERS, [render.top_row(job, now) for job, now in rows]),
    )


def logs(args: argparse.Namespace, api: Api) -> int:
    path = jobs_path(args, api, args.job_id)
    raw = args.raw or not sys.stdout.isatty()  # to a file or a pipe, byte for byte; to a terminal, made safe
    if args.follow:
        return follow.logs(
            api,
            path,
            task=args.task,
            progress=args.progress or (sys.stderr.isatty() and not args.no_progress),
            raw=raw,
        )
    text = "".join(api.log_pages(f"{path}/logs", task=args.task))
    shown = text if raw else render.safe_output(text)
    print(render.dumps({"job_id": args.job_id, "task": args.task, "text": text}) if args.json else shown, end="")
    return 0


def act(action: str):
    def command(args: argparse.Namespace, api: Api) -> int:
        job = api.call("POST", f"{jobs_path(args, api, args.job_id)}/actions", json={"action_type": action})
        return out(
            args,
            job,
            f"{job['metadata']['name']} ({job['metadata']['id']}): {action} requested, now {job['status']['phase']}",
        )

    return command


def delete(args: argparse.Namespace, api: Api) -> int:
    api.call("DELETE", jobs_path(args, api, args.job_id))
    return out(args, {"deleted": args.job_id}, f"deleted {args.job_id}")


def gpus(node: dict) -> str:
    counts: dict[str, int] = {}
    for gpu in node.get("gpus") or []:
        key = f"{gpu['model']} {gpu['memory_gb']:g}GB"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n}x {k}" for k, n in counts.items()) or "-"


def gpus_now(node: dict) -> str:
    """Each GPU read at the last heartbeat: `#0 87% 12.3GB`; `-` when none was."""
    read = [g for g in node.get("gpus") or [] if g.get("util_percent") is not None]
    return " ".join(f"#{g['index']} {g['util_percent']:.0f}% {g.get('memory_used_gb') or 0:.1f}GB" for g in read) or "-"


def jobs_on(node: dict) -> str:
    """Job ids the caller may see, and how many tasks of other projects run there."""
    shown = [r["job_id"][:8] for r in node.get("running") or []]
    if node.get("other_tasks"):
        shown.append(f"+{node['other_tasks']} other")
    return ", ".join(shown) or "-"


def nodes(args: argparse.Namespace, api: Api) -> int:
    answer = api.call("GET", "/v2/nodes")
    rows = [
        [
            n["node_id"],
            n.get("kind", "?"),
            n["state"],
            gpus(n),
            f"{sum(g['tflops'] for g in n.get('gpus') or []):g}",
            f"{n.get('cpu_count', 0):g}",
            f"{n.get('memory_gb', 0):g}",
            f"{n.get('price_per_hour', 0):.2f}",
            gpus_now(n),
            jobs_on(n),
        ]
        for n in answer["items"]
    ]
    headers = ("node", "kind", "state", "gpus", "tflops", "cpus", "mem_gb", "$/hour", "gpus_now", "jobs")
    return out(args, answer, render.table(headers, rows))


def usage(args: argparse.Namespace, api: Api) -> int:
    params = {k: v for k, v in (("from", args.start), ("to", args.end)) if v}
    report = api.call("GET", f"/v2/{project(args, api)}/usage", params=params)
    headers = ("", "attempts", "hours", "gpu_hours", "cost")

    def rows(items: list[dict]) -> list[list[Any]]:
        return [
            [
                i["key"] or "total",
                i["attempts"],
                f"{i['seconds'] / 3600:.3f}",
                f"{i['gpu_hours']:.3f}",
                f"{i['cost']:.2f}" if i["cost"] >= 1 else f"{i['cost']:.4f}",
            ]
            for i in items
        ]

    text = "\n\n".join(
        [
            render.table(("by user", *headers[1:]), rows(report["by_user"])),
            render.table(("by node kind", *headers[1:]), rows(report["by_node_kind"])),
            render.table(headers, rows([report["total"]])),
        ]
    )
    if report.get("open_attempts"):
        text += f"\n({report['open_attempts']} attempt(s) still running, charged up to now)"
    return out(args, report, text)


def estimate(args: argparse.Namespace, api: Api) -> int:
    """The dry run: where the job could run, for how long, at what cost; nothing is created."""
    answer = api.call("POST", jobs_path(args, api), params={"dry_run": "true"}, json=jobfile.body(args))
    headers = ("kind", "node or type", "gpus", "$/hour", "hours", "expected $", "free now")
    rows = [
        [
            c["node_kind"],
            c["node_id"] or c["instance_type"] or "",
            f"{c['gpus']} {c['gpu_model']}".strip(),
            f"{c['price_per_hour']:.2f}",
            f"{c['predicted_duration_s'] / 3600:.2f}",
            f"{c['expected_cost']:.2f}",
            "yes" if c["free_now"] else f"no (+{c['startup_delay_s']:.0f}s boot)" if c["startup_delay_s"] else "no",
        ]
        for c in answer["candidates"]
    ]
    text = render.table(headers, rows)
    for kind, why in answer.get("unplaceable_kinds", {}).items():
        text += f"\n{kind}: {why}"
    return out(args, answer, text)


def quota(args: argparse.Namespace, api: Api) -> int:
    """Show the project's quotas and month to date; with limits given, set them (the admin)."""
    path = f"/v2/{project(args, api)}/quotas"
    limits = {
        k: v
        for k, v in (
            ("max_gpus", args.max_gpus),
            ("gpu_hours_per_month", args.gpu_hours),
            ("budget_per_month", args.budget),
        )
        if v is not None
    }
    if limits and args.user:
        current = api.call("GET", path)["quotas"]["users"].get(args.user, {})
        answer = api.call("PUT", f"{path}/users/{args.user}", json={**current, **limits})
    elif limits:
        current = api.call("GET", path)["quotas"]
        answer = api.call("PUT", path, json={**current, **limits})
    else:
        answer = api.call("GET", path)
    q, used = answer["quotas"], answer["used"]

    def limit(value) -> str:
        return "none" if value is None else f"{value:g}"

    rows = [["project", limit(q["max_gpus"]), limit(q["gpu_hours_per_month"]), limit(q["budget_per_month"])]]
    rows += [
        [
            f"user {name}",
            limit(u.get("max_gpus")),
            limit(u.get("gpu_hours_per_month")),
            limit(u.get("budget_per_month")),
        ]
        for name, u in sorted(q["users"].items())
    ]
    text = render.table(("scope", "max gpus", "gpu-hours/month", "budget $/month"), rows)
    text += (
        f"\nthis month: {used['gpu_hours']:.2f} GPU-hours, ${used['spend']:.2f} spent, "
        f"{answer['gpus_in_use']} GPU(s) in use"
    )
    return out(args, answer, text)
