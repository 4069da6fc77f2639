"""`trainmaster webhook`: where the project's notifications go (a job finished, failed, was rescheduled, went over
budget) and the secret that signs them; `set`, `clear`, and the recent notifications with how each delivery went."""

import argparse
import sys

from services.cli import render
from services.cli.client import Api
from services.cli.commands import out, project


def path(args: argparse.Namespace, api: Api) -> str:
    return f"/v2/{project(args, api)}/notifications"


def show(args: argparse.Namespace, api: Api) -> int:
    answer = api.call("GET", path(args, api), params={"limit": args.limit})
    where = answer["webhook_url"] or "none (notifications are kept, not sent)"
    rows = [
        [n["created_at"], n["kind"], (n["job_id"] or "-")[:8], n["state"], n["attempts"], n["error"] or "-"]
        for n in answer["items"]
    ]
    text = f"webhook: {where}" + (", signed" if answer["signed"] else "")
    if rows:
        text += "\n" + render.table(("created", "kind", "job", "delivery", "tries", "error"), rows)
    return out(args, answer, text)


def set_url(args: argparse.Namespace, api: Api) -> int:
    answer = api.call(
        "PUT", path(args, api), json={"webhook_url": args.webhook_url, "rotate_secret": args.rotate_secret}
    )
    secret = answer.get("signing_secret")
    if args.json:
        return out(args, answer, "")
    if not secret:  # the secret stays the one shown when it was made
        return out(args, answer, f"webhook: {answer['webhook_url']}, signed with the secret it had")
    # stdout holds the secret alone: SECRET=$(trainmaster webhook set URL)
    print(
        render.safe(
            f"webhook: {answer['webhook_url']}; the secret that signs its deliveries (webhook-signature: v1,...) "
            "is shown only now" + ("; the one it replaces signs beside it for 24 hours" if args.rotate_secret else "")
        ),
        file=sys.stderr,
    )
    return out(args, answer, secret)


def clear(args: argparse.Namespace, api: Api) -> int:
    answer = api.call("PUT", path(args, api), json={"webhook_url": None})
    return out(args, answer, "webhook: none (notifications are kept, not sent)")


def add_parser(sub: argparse._SubParsersAction, shared: argparse.ArgumentParser) -> None:
    """The `webhook` command: the project's webhook and its recent notifications; `set` and `clear`."""
    help_ = "the project's webhook and its recent notifications; set it (its signing secret shown once) or clear it"
    hook = sub.add_parser("webhook", parents=[shared], help=help_, description=help_)
    hook.set_defaults(handler=show)
    hook.add_argument("--limit", type=int, default=20, help="recent notifications shown (at most 500)")
    actions = hook.add_subparsers(dest="webhook_command", metavar="ACTION")
    s = actions.add_parser(
        "set",
        parents=[shared],
        help="send the project's notifications to URL (https, a public address)",
        description="Send the project's notifications to URL. A new webhook, or one moved to another origin, gets a "
        "new signing secret, printed once (alone on stdout); --rotate-secret makes a new one for the same URL.",
    )
    s.set_defaults(handler=set_url)
    s.add_argument("webhook_url", metavar="URL")  # not `url`: --url is the API's
    s.add_argument("--rotate-secret", action="store_true", help="a new secret; the old one signs beside it 24 hours")
    actions.add_parser("clear", parents=[shared], help="send nothing (notifications are kept)").set_defaults(
        handler=clear
    )
