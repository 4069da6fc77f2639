"""`trainmaster token list|create|revoke` and the fleet table's view of other projects' tasks."""

from services.cli import commands
from services.cli.__main__ import parser


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def call(self, method: str, path: str, **kwargs):
        self.calls.append((method, path, kwargs.get("json")))
        if path == "/v2/me":
            return {"user_name": "ana"}
        if method == "POST":
            return {"token": "tm_secret", "token_id": "tk_0123456789abcdef", "expires": "2027-01-01T00:00:00Z"}
        if method == "GET":
            return {
                "count": 1,
                "items": [
                    {
                        "token_id": "tk_0123456789abcdef",
                        "created": "2026-11-23T15:00:00Z",
                        "expires": None,
                        "last_used": None,
                        "source": "api",
                    }
                ],
            }
        return None


def run(argv: list[str], api: FakeApi, capsys) -> str:
    args = parser().parse_args(argv)
    args.json = getattr(args, "json", False)
    assert args.handler(args, api) == 0
    return capsys.readouterr().out


def test_token_commands_act_on_your_own_tokens_by_default(capsys):
    api = FakeApi()
    assert "tm_secret" in run(["token", "create", "--expires-in", "600"], api, capsys)
    assert "tk_0123456789abcdef" in run(["token", "list"], api, capsys)
    run(["token", "revoke", "tk_0123456789abcdef"], api, capsys)
    assert [c for c in api.calls if c[1] != "/v2/me"] == [
        ("POST", "/v2/users/ana/tokens", {"expires_in": 600}),
        ("GET", "/v2/users/ana/tokens", None),
        ("DELETE", "/v2/users/ana/tokens/tk_0123456789abcdef", None),
    ]


def test_a_new_token_is_alone_on_stdout(capsys):
    args = parser().parse_args(["token", "create", "--user", "ana"])
    args.json = False
    assert args.handler(args, FakeApi()) == 0
    captured = capsys.readouterr()
    assert captured.out == "tm_secret\n" and "shown only now" in captured.err


def test_the_admin_names_the_user(capsys):
    api = FakeApi()
    run(["token", "list", "--user", "bob"], api, capsys)
    assert api.calls == [("GET", "/v2/users/bob/tokens", None)]


def test_the_fleet_table_counts_other_projects_tasks():
    assert commands.jobs_on({"running": [{"job_id": "0123456789"}], "other_tasks": 2}) == "01234567, +2 other"
    assert commands.jobs_on({"running": [], "other_tasks": 0}) == "-"
