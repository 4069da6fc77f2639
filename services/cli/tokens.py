"""`trainmaster token`: list, create and revoke a user's API tokens (your own unless --user, which the admin may)."""

import argparse
import sys

from services.cli import render
from services.cli.client import Api
from services.cli.commands import out


def whose(args: argparse.Namespace, api: Api) -> str:
    return args.user or api.call("GET", "/v2/me")["user_name"]


def rows(items: list[dict]) -> list[list[str]]:
    return [
        [
            t["token_id"],
            t.get("source", "api"),
            t.get("created") or "-",
            t.get("expires") or "never",
            t.get("last_used") or "never",
        ]
        for t in items
    ]


def list_tokens(args: argparse.Namespace, api: Api) -> int:
    answer = api.call("GET", f"/v2/users/{whose(args, api)}/tokens")
    return out(
        args, answer, render.table(("token id", "source", "created", "expires", "last used"), rows(answer["items"]))
    )


def create(args: argparse.Namespace, api: Api) -> int:
    body = {"expires_in": args.expires_in} if args.expires_in else {}
    answer = api.call("POST", f"/v2/users/{whose(args, api)}/tokens", json=body)
    if not args.json:  # stdout holds the token alone: TOKEN=$(trainmaster token create)
        print(
            render.safe(
                f"token id {answer['token_id']}, expires {answer['expires'] or 'never'}; the token is shown only now"
            ),
            file=sys.stderr,
        )
    return out(args, answer, answer["token"])


def revoke(args: argparse.Namespace, api: Api) -> int:
    user = whose(args, api)
    api.call("DELETE", f"/v2/users/{user}/tokens/{args.token_id}")
    return out(args, {"revoked": args.token_id, "user_name": user}, f"revoked {args.token_id} of {user}")


def add_parser(sub: argparse._SubParsersAction, shared: argparse.ArgumentParser) -> None:
    """The `token` command and its actions, beside the other commands."""
    help_ = "list, create or revoke API tokens (yours, or --user's as the admin)"
    actions = sub.add_parser("token", help=help_, description=help_).add_subparsers(
        dest="token_command", required=True, metavar="ACTION"
    )
    for name, handler, help_ in (
        ("list", list_tokens, "a user's tokens: id, created, expires, last used"),
        ("create", create, "a new token (printed once)"),
        ("revoke", revoke, "revoke a token by its id; it stops working at once"),
    ):
        p = actions.add_parser(name, parents=[shared], help=help_, description=help_)
        p.set_defaults(handler=handler)
        p.add_argument("--user", help="another user's tokens (the admin)")
        if name == "create":
            p.add_argument("--expires-in", type=int, metavar="SECONDS", help="the token stops working after this")
        if name == "revoke":
            p.add_argument("token_id")
