"""`trainmaster webhook [set URL [--rotate-secret] | clear]`: the project's webhook from the command line."""

from types import SimpleNamespace

from services.cli.__main__ import parser

SECRET = "whsec_" + "A" * 43


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def call(self, method: str, path: str, **kwargs):
        self.calls.append((method, path, kwargs.get("json"), kwargs.get("params")))
        if method == "GET":
            return {
                "webhook_url": "https://hooks.example.org/x",
                "signed": True,
                "count": 1,
                "items": [
                    {
                        "id": "n1",
                        "job_id": "0123456789ab",
                        "user_name": "ana",
                        "kind": "job.failed",
                        "message": "m",
                        "state": "failed",
                        "attempts": 6,
                        "error": "HTTP 500",
                        "created_at": "2026-11-29T10:00:00+00:00",
                    }
                ],
            }
        url = kwargs["json"]["webhook_url"]
        made = SECRET if url and kwargs["json"].get("rotate_secret") else None
        return {"webhook_url": url, "signed": bool(url), "signing_secret": made}


def run(argv: list[str], api: FakeApi, capsys) -> tuple[str, str]:
    args = parser().parse_args(argv)
    args.json, args.settings = getattr(args, "json", False), SimpleNamespace(project="vision")
    assert args.handler(args, api) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_the_webhook_and_its_recent_deliveries_are_shown(capsys):
    api = FakeApi()
    out, _ = run(["webhook", "--limit", "5"], api, capsys)
    assert "https://hooks.example.org/x, signed" in out and "job.failed" in out and "HTTP 500" in out
    assert api.calls == [("GET", "/v2/vision/notifications", None, {"limit": 5})]


def test_a_secret_made_is_alone_on_stdout_and_said_to_be_shown_once(capsys):
    api = FakeApi()
    out, err = run(["webhook", "set", "https://hooks.example.org/x", "--rotate-secret"], api, capsys)
    assert out == SECRET + "\n" and "shown only now" in err and "24 hours" in err
    assert api.calls == [
        ("PUT", "/v2/vision/notifications", {"webhook_url": "https://hooks.example.org/x", "rotate_secret": True}, None)
    ]


def test_a_webhook_set_again_without_a_new_secret_says_it_keeps_its_own_and_clear_sends_null(capsys):
    api = FakeApi()
    out, _ = run(["webhook", "set", "https://hooks.example.org/y"], api, capsys)
    assert "signed with the secret it had" in out and SECRET not in out
    out, _ = run(["webhook", "clear"], api, capsys)
    assert "none" in out and api.calls[-1][2] == {"webhook_url": None}


def test_the_webhooks_url_is_not_taken_for_the_apis():
    args = parser().parse_args(["webhook", "set", "https://hooks.example.org/x"])
    assert args.webhook_url == "https://hooks.example.org/x" and getattr(args, "url", None) is None
