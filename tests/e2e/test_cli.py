"""The `trainmaster` CLI against the running stack: every command, as a researcher types it."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ADMIN_TOKEN, exchange
from tests.factories import unique

pytestmark = pytest.mark.e2e

TRAIN = (
    'python3 -c "import time\nfor step in range(1, 31):\n'
    "    print(f'step {step} loss {1.0 - step * 0.03:.3f}', flush=True)\n    time.sleep(0.15)\n\""
)
LOSS = "loss:loss (?P<value>[0-9.]+):min:0.1"


def train_after(go: Path) -> str:
    """TRAIN once `go` exists: a watch started after the submission sees the job run, however long the CLI took
    to start (on a loaded machine its first poll came after the 4.5-s job had ended)."""
    return TRAIN.replace("import time\n", f"import os, time\nwhile not os.path.exists('{go}'): time.sleep(0.1)\n", 1)


@pytest.fixture
def cli(stack, project, tmp_path):
    """Run `python -m services.cli ARGS` with the stack in its environment; return (exit code, stdout, stderr)."""
    env = {
        **os.environ,
        "TRAINMASTER_URL": stack.api_url,
        "TRAINMASTER_TOKEN": ADMIN_TOKEN,
        "TRAINMASTER_PROJECT": project,
        "HOME": str(tmp_path),
    }

    def run(*args: str, timeout_s: float = 90, **extra_env: str) -> tuple[int, str, str]:
        done = subprocess.run(
            [sys.executable, "-m", "services.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**env, **extra_env},
        )
        return done.returncode, done.stdout, done.stderr

    def start(*args: str) -> subprocess.Popen:
        """The command started, its output piped as text (a watch the test reads while it runs)."""
        return subprocess.Popen(
            [sys.executable, "-m", "services.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    run.start = start  # type: ignore[attr-defined]
    return run


def wait_phase(cli, job_id: str, *phases: str, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code, out, err = cli("get", job_id, "--json")
        assert code == 0, err
        job = json.loads(out)
        if job["status"]["phase"] in phases:
            return job
        time.sleep(0.3)
    raise AssertionError(f"{job_id} never reached {phases}: {job['status']}")


def test_submit_watch_logs_list_get_and_usage(cli, stack):
    name = unique("cli")
    go = exchange(stack.settings.data_dir) / name
    code, out, err = cli(
        "submit",
        "--name",
        name,
        "--command",
        train_after(go),
        "--metric",
        LOSS,
        "--gpus",
        "1",
        "--allowed",
        "local",
        "--priority",
        "cost",
        "--expected-duration",
        "30",
        "--param",
        "lr=0.1",
    )
    assert code == 0, err
    job_id = out.strip()

    watching = cli.start("get", job_id, "--watch")
    first = watching.stdout.readline()  # its first status line: the watch is polling
    go.touch()
    rest, err = watching.communicate(timeout=90)
    code, out = watching.returncode, first + rest
    assert code == 0, err
    assert "ETA" in out and "[" in out and "Completed" in out.splitlines()[-1], out
    assert "100%" in out.splitlines()[-1]

    code, out, err = cli("logs", job_id, "-f")
    assert code == 0, err
    assert out.count("loss") == 30 and "step 30 loss 0.100" in out

    code, out, _ = cli("list")
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["ID", "NAME", "USER", "PHASE"] and any(job_id in r and "Completed" in r for r in rows)
    listed = json.loads(cli("list", "--json", "--phase", "Completed")[1])
    assert [j["metadata"]["id"] for j in listed["items"]] == [job_id]
    assert json.loads(cli("list", "--json", "--user", "nobody")[1])["items"] == []

    code, out, _ = cli("get", job_id)
    assert code == 0 and name in out and "Completed" in out and "placement local/cost" in out
    job = json.loads(cli("--json", "get", job_id)[1])
    assert job["spec"]["resource"]["gpu_count"] == 1 and job["algorithm"]["parameters"] == [
        {"name": "lr", "value": "0.1"}
    ]

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        report = json.loads(cli("usage", "--json")[1])
        if report["total"]["attempts"] == 1:
            break
        time.sleep(0.5)
    assert report["by_user"][0]["key"] == "admin"
    code, out, _ = cli("usage", "--from", "2020-01-01T00:00:00Z")
    assert code == 0 and "BY USER" in out and "admin" in out and "BY NODE KIND" in out and "local" in out


def test_a_followed_job_returns_its_exit_code(cli, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"""
metadata:
  name: {unique("cli-fail")}
  description: exits 3
algorithm:
  command: echo about to fail; exit 3
spec:
  resource: {{gpu_count: 0}}
""")
    code, out, err = cli("submit", "-f", str(job_file), "--follow")
    assert code == 3, (out, err)
    assert "about to fail" in out

    code, out, err = cli("--json", "submit", "-f", str(job_file), "--name", unique("cli-fail"))
    assert code == 0, err
    job_id = json.loads(out)["metadata"]["id"]
    code, out, err = cli("logs", job_id, "--follow", "--no-progress")
    assert code == 3 and out == "about to fail\n", (out, err)
    assert cli("logs", job_id)[1] == "about to fail\n"


def test_a_secret_is_taken_from_the_callers_environment_and_never_shown(cli):
    value = f"hf_{unique('token')}"
    command = 'python3 -c \'import os; t = os.environ["HF_TOKEN"]; print("len", len(t), "token", t)\''
    code, out, err = cli(
        "submit", "--command", command, "--secret", "HF_TOKEN", "--gpus", "0", "--follow", HF_TOKEN=value
    )
    assert code == 0, (out, err)
    assert f"len {len(value)} token ***" in out and value not in out + err  # the task had it, masked in its output
    code, out, err = cli("submit", "--command", "true", "--secret", "NOT_SET_ANYWHERE")
    assert code != 0 and "--secret NOT_SET_ANYWHERE: set NOT_SET_ANYWHERE in your environment first" in err


def test_migrate_terminate_and_delete(cli):
    code, out, err = cli(
        "submit", "--name", unique("cli-long"), "--command", "sleep 60", "--gpus", "1", "--allowed", "local"
    )
    job_id = out.strip()
    assert code == 0, err
    wait_phase(cli, job_id, "Running")

    code, out, err = cli("delete", job_id)
    assert code == 65 and "error 406014" in err, (code, err)

    code, out, err = cli("migrate", job_id)
    assert code == 0 and "migrate requested" in out, (code, out, err)
    wait_phase(cli, job_id, "Running")

    code, out, err = cli("terminate", job_id)
    assert code == 0 and "terminate requested" in out, err
    code, out, err = cli("logs", job_id, "-f")
    assert code == 143, (code, out, err)

    assert cli("delete", job_id)[0] == 0
    code, out, err = cli("get", job_id)
    assert code == 65 and "error 406012" in err


def test_nodes_and_errors(cli, project):
    code, out, err = cli("nodes")
    assert code == 0, err
    assert "NODE" in out and "local-1" in out and "2x RTX-4090 24GB" in out and "on_demand" in out
    nodes = json.loads(cli("nodes", "--json")[1])
    assert {n["kind"] for n in nodes["items"]} == {"local", "reserved", "on_demand"}

    code, _, err = cli("list", TRAINMASTER_TOKEN="wrong")
    assert code == 77 and "error 406039" in err
    code, _, err = cli("list", TRAINMASTER_URL="http://127.0.0.1:9", TRAINMASTER_HANDOVER_S="1")  # not 30 s
    assert code == 69 and "cannot reach" in err
    code, _, err = cli("submit", "--gpus", "1")
    assert code == 2 and "needs a command" in err
    code, _, err = cli("submit", "--name", "bad name", "--command", "true")
    assert code == 65 and "error 406001" in err and "metadata.name" in err
    code, _, err = cli("list", TRAINMASTER_TOKEN="", HOME="/nonexistent")
    assert code == 78


def test_the_projects_webhook_is_set_shown_rotated_and_cleared(cli):
    url = "http://127.0.0.1:9/hook"  # nothing listens: deliveries would fail, none is due while the test runs
    code, secret, err = cli("webhook", "set", url)
    assert code == 0, err
    assert secret.startswith("whsec_") and "shown only now" in err  # the secret alone on stdout
    code, out, err = cli("webhook")
    assert code == 0 and f"webhook: {url}, signed" in out and secret.strip() not in out
    code, again, err = cli("webhook", "set", url)
    assert code == 0 and "signed with the secret it had" in again
    code, rotated, err = cli("webhook", "set", url, "--rotate-secret")
    assert code == 0 and rotated.startswith("whsec_") and rotated != secret and "24 hours" in err
    code, out, err = cli("webhook", "clear")
    assert code == 0 and "none" in out
    assert json.loads(cli("--json", "webhook")[1])["webhook_url"] is None
    code, _, err = cli("webhook", "set", "http://10.0.0.1/hook")  # a private address: refused, naming the field
    assert code == 65 and "webhook_url" in err


def test_the_config_file_is_read(cli, tmp_path, stack, project):
    config = tmp_path / "home" / ".config" / "trainmaster"
    config.mkdir(parents=True)
    (config / "config.toml").write_text(f'url = "{stack.api_url}"\ntoken = "{ADMIN_TOKEN}"\nproject = "{project}"\n')
    code, out, err = cli(
        "list", HOME=str(tmp_path / "home"), TRAINMASTER_URL="", TRAINMASTER_TOKEN="", TRAINMASTER_PROJECT=""
    )
    assert code == 0 and out.startswith("ID"), err


def test_estimate_and_quota(cli):
    code, out, err = cli(
        "estimate", "--name", "what-if", "--command", "true", "--gpus", "1", "--expected-duration", "3600"
    )
    assert code == 0, err
    assert "reserved" in out and "EXPECTED $" in out
    code, out, err = cli("--json", "estimate", "--name", "what-if", "--command", "true", "--gpus", "1")
    assert code == 0 and json.loads(out)["dry_run"] is True
    code, out, err = cli("list")
    assert "what-if" not in out  # a dry run creates nothing
    code, out, err = cli("quota", "--budget", "250", "--max-gpus", "4")
    assert code == 0, err
    assert "250" in out and "4" in out
    code, out, err = cli("quota", "--user", "ana", "--gpu-hours", "10")
    assert code == 0, err
    code, out, err = cli("--json", "quota")
    quotas = json.loads(out)["quotas"]
    assert quotas["budget_per_month"] == 250 and quotas["max_gpus"] == 4
    assert quotas["users"]["ana"]["gpu_hours_per_month"] == 10
    cli("quota", "--budget", "100000", "--max-gpus", "1000")  # leave the shared stack's project usable
