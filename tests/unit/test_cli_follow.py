"""`trainmaster` tells the story of a job it follows (a line per phase, then phase, cost and exit code), summarises a
new search, follows one, and ends quietly when its reader goes away."""

import json
import os
import subprocess
import sys

import httpx
import pytest

from services.cli import follow, render, searches
from services.cli.__main__ import main, parser
from services.cli.client import Api, CliError
from tests.unit.test_cli_search import SEARCH

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def job(phase: str, *, node: str = "local-1", exit_code: int | None = None) -> dict:
    tasks = [{"task": "worker-0", "exit_code": exit_code}] if exit_code is not None else []
    return {
        "metadata": {"id": "j-1", "name": "first-job"},
        "status": {
            "phase": phase,
            "secondary_phase": phase,
            "node_ids": [node] if phase != "Pending" else [],
            "duration": 21_000,
            "reason": "",
            "task_statuses": tasks,
        },
    }


def fake_api(phases: list[dict], *, cost: float = 0.0123) -> tuple[Api, list[str]]:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.url.path}?{request.url.query.decode()}")
        if request.url.path.endswith("/logs"):
            return httpx.Response(200, text="step 0 loss 1.0\nstep 1 loss 0.5\n")
        if request.url.path.endswith("/usage"):
            return httpx.Response(200, json={"total": {"cost": cost}})
        return httpx.Response(200, json=phases.pop(0) if len(phases) > 1 else phases[0])

    return Api(url="http://api", token="t", transport=httpx.MockTransport(answer)), asked


def test_a_piped_follow_prints_each_phase_once_then_the_final_phase_cost_and_exit_code(monkeypatch, capsys):
    monkeypatch.setattr(follow, "POLL_S", 0.0)
    api, asked = fake_api([job("Pending"), job("Running"), job("Running"), job("Failed", exit_code=3)])
    code = follow.logs(api, "/v2/vision/training-jobs/j-1", task="worker-0", progress=False)
    out, err = capsys.readouterr()
    assert code == 3
    assert out == "step 0 loss 1.0\nstep 1 loss 0.5\n"  # stdout stays the job's own output
    assert err.count("first-job: Running on local-1") == 1
    assert err.rstrip().splitlines()[-1] == "first-job (j-1): Failed after 21s on local-1, cost $0.0123, exit 3"
    assert "/v2/vision/usage?job_id=j-1" in asked  # billing's figure, not one the CLI makes up


def test_the_closing_line_says_when_the_cost_is_unknown():
    assert render.closing_line(job("Completed"), cost=None, exit_code=0).endswith("cost unknown, exit 0")
    assert render.closing_line(job("Completed"), cost=2.5, exit_code=0).endswith("cost $2.50, exit 0")


def test_a_new_search_is_summarised_with_how_to_follow_it():
    text = searches.created(SEARCH)
    assert "up to 3 trials over lr, opt, 2 at a time, min loss, pruner predicted" in text
    assert text.endswith("trainmaster search get --follow s-1")


def test_search_get_follow_polls_until_the_search_ends(capsys):
    running = {**SEARCH, "status": {**SEARCH["status"], "phase": "Running"}}
    done = {**SEARCH, "status": {**SEARCH["status"], "phase": "Completed"}}
    answers = [running, running, done]
    api = Api(
        url="http://api",
        token="t",
        transport=httpx.MockTransport(lambda request: httpx.Response(200, json=answers.pop(0))),
    )
    assert searches.follow(api, "/v2/p/searches/s-1", sleep=lambda s: None)["status"]["phase"] == "Completed"
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "sweep Running: 1 completed, 1 pruned of 3; best 0.25 (trial 0)",
        "sweep Completed: 1 completed, 1 pruned of 3; best 0.25 (trial 0)",
    ]
    assert parser().parse_args(["search", "get", "--follow", "s-1"]).follow is True


def test_an_invalid_url_is_an_error_line_not_a_traceback(monkeypatch, capsys):
    monkeypatch.delenv("TRAINMASTER_URL", raising=False)
    assert main(["--url", "http://[::1", "--token", "t", "-p", "p", "list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid API URL") and "Traceback" not in err


@pytest.mark.parametrize("lines", [3, 20000])
def test_a_closed_pipe_ends_quietly(lines, tmp_path):
    """`trainmaster list | head -1`: no BrokenPipeError traceback, whether the output fits the pipe or not."""
    script = tmp_path / "many.py"
    script.write_text(
        "import sys\n"
        "from services.cli import __main__ as cli, commands\n"
        f"commands.list_jobs = lambda args, api: [print(f'job {{i}}') for i in range({lines})] and 0\n"
        "cli.Api = lambda **kw: None\n"
        "sys.exit(cli.main(['--url', 'http://x', '--token', 't', '-p', 'p', 'list']))\n"
    )
    pipeline = f"{sys.executable} {script} | head -1"
    done = subprocess.run(
        ["bash", "-c", pipeline],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.stdout == "job 0\n"
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_submit_without_a_name_leaves_it_to_the_api():
    from services.cli import jobfile

    args = parser().parse_args(["submit", "--command", "true", "--gpus", "1"])
    assert jobfile.body(args)["metadata"] == {}


def test_search_create_follow_summarises_then_follows_to_the_table(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(searches, "POLL_S", 0.0)
    done = {**SEARCH, "status": {**SEARCH["status"], "phase": "Completed"}}
    answers = [SEARCH, done]
    api = Api(
        url="http://api",
        token="t",
        transport=httpx.MockTransport(lambda request: httpx.Response(200, json=answers.pop(0))),
    )
    (tmp_path / "s.yaml").write_text("space: {}\n")
    args = parser().parse_args(["-p", "p", "search", "create", "-f", str(tmp_path / "s.yaml"), "--follow"])
    args.json, args.settings = False, type("S", (), {"project": "p"})()
    assert args.handler(args, api) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("search sweep (s-1): up to 3 trials") and "sweep Completed" in captured.err
    assert "best: trial 0 = 0.25" in captured.out


def test_search_create_puts_each_secret_from_the_callers_environment_into_the_template(monkeypatch, tmp_path):
    sent: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(201, json=SEARCH)

    api = Api(url="http://api", token="t", transport=httpx.MockTransport(answer))
    (tmp_path / "s.yaml").write_text("template: {algorithm: {command: train, secrets: {A_KEY: from-file}}}\n")
    argv = ["-p", "p", "search", "create", "-f", str(tmp_path / "s.yaml"), "--secret", "HF_TOKEN"]
    args = parser().parse_args(argv)
    args.json, args.settings = True, type("S", (), {"project": "p"})()
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(CliError, match="--secret HF_TOKEN: set HF_TOKEN in your environment first"):
        args.handler(args, api)
    monkeypatch.setenv("HF_TOKEN", "hf_value")
    assert args.handler(args, api) == 0
    assert sent[-1]["template"]["algorithm"]["secrets"] == {"A_KEY": "from-file", "HF_TOKEN": "hf_value"}
    assert "hf_value" not in " ".join(argv)
