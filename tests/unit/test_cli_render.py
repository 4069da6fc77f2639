"""The CLI's pure parts: job files and flags, tables, the progress bar, exit codes."""

import io
import sys
from types import SimpleNamespace

import pytest

from services.cli import jobfile, render
from services.cli.client import CliError
from services.cli.follow import EXIT_TERMINATED, Bar, job_exit


def job(*, phase="Running", eta=None, exits=(), name="j1") -> dict:
    return {
        "metadata": {
            "id": "0f" * 18,
            "name": name,
            "user_name": "ana",
            "create_time": 0,
            "project_id": "p",
            "description": "",
        },
        "status": {
            "phase": phase,
            "secondary_phase": phase,
            "duration": 65_000,
            "node_id": "local-1",
            "node_ids": ["local-1"],
            "eta": eta,
            "task_statuses": [{"task": "worker-0", "exit_code": c, "message": ""} for c in exits],
        },
    }


def flags(**given) -> SimpleNamespace:
    names = (
        "file",
        "name",
        "description",
        "command",
        "param",
        "env",
        "metric",
        "nodes",
        "gpus",
        "min_gpu_memory_gb",
        "cpus",
        "memory_gb",
        "allowed",
        "priority",
        "expected_duration",
        "max_duration",
    )
    return SimpleNamespace(**{n: given.get(n) for n in names})


def test_flags_override_the_job_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "metadata: {name: from-file}\nalgorithm:\n  command: train\n"
        "  parameters: [{name: lr, value: '1'}]\n"
        "spec: {resource: {gpu_count: 4}}\n"
    )
    body = jobfile.body(flags(file=str(path), gpus=1, param=["lr=0.1", "bs=8"], allowed="local"))
    assert body["metadata"]["name"] == "from-file" and body["algorithm"]["command"] == "train"
    assert body["spec"]["resource"]["gpu_count"] == 1 and body["spec"]["placement"] == {"allowed": "local"}
    assert body["algorithm"]["parameters"] == [{"name": "lr", "value": "0.1"}, {"name": "bs", "value": "8"}]


def test_a_job_needs_a_command_and_leaves_a_missing_name_to_the_api():
    with pytest.raises(CliError) as caught:
        jobfile.body(flags(name="named"))
    assert caught.value.exit_code == 2
    assert jobfile.body(flags(command="true"))["metadata"] == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("loss:loss (?P<value>[0-9.]+)", {"name": "loss", "regex": "loss (?P<value>[0-9.]+)"}),
        ("acc:acc=(\\d+):max", {"name": "acc", "regex": "acc=(\\d+)", "mode": "max"}),
        ("loss:a:(\\d+):min:0.1", {"name": "loss", "regex": "a:(\\d+)", "mode": "min", "target": 0.1}),
    ],
)
def test_metric_flag(text, expected):
    assert jobfile.metric(text) == expected


def test_the_progress_bar_shows_progress_and_the_eta_interval():
    line = render.bar(job(eta={"progress": 0.5, "remaining_s": 65, "low_s": 50, "high_s": 90}))
    assert "[" + "#" * 12 + "." * 12 + "]" in line and "50%" in line and "ETA 1m05s (50s–1m30s)" in line
    assert "on local-1" in line
    assert "ETA" not in render.bar(job(phase="Completed"))


def test_table_aligns_columns():
    assert render.table(("a", "bb"), [["xxx", 1], ["y", None]]).splitlines() == ["A    BB", "xxx  1", "y"]


@pytest.mark.parametrize(
    ("phase", "exits", "code"),
    [
        ("Completed", (0,), 0),
        ("Failed", (3,), 3),
        ("Failed", (None,), 1),
        ("Failed", (0, 7), 7),
        ("Terminated", (143,), EXIT_TERMINATED),
        ("Failed", (300,), 255),
    ],
)
def test_a_followed_job_exits_with_its_outcome(phase, exits, code):
    assert job_exit(job(phase=phase, exits=exits)) == code


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_is_redrawn_in_place_and_output_goes_above_it():
    screen, output = Terminal(), io.StringIO()
    bar = Bar(screen)
    bar.show(job(eta={"progress": 0.25, "remaining_s": 30, "low_s": 20, "high_s": 40}))
    bar.above("step 1\n", output)
    assert screen.getvalue().count("\r\033[K") == 2 and screen.getvalue().endswith(bar.last)
    assert output.getvalue() == "step 1\n"


def test_a_narrow_eta_band_is_shown_precisely_and_a_wide_one_as_the_rough_range_it_is():
    assert render.eta_phrase(65, 50, 90) == "1m05s (50s–1m30s)"
    assert render.eta_phrase(3, 0, 6) == "3s (0s–6s)"  # a few seconds wide: not "wide"
    assert render.eta_phrase(120, 60, 360) == "about 2 min, could be 1–6 min"
    assert render.eta_phrase(50, 30, 80) == "about 50 s, could be 30–80 s"
    assert render.eta_phrase(7200, 3000, 20000) == "about 2 h, could be 0–6 h"
    wide = job(eta={"remaining_s": 120, "low_s": 60, "high_s": 360, "progress": 0.1})
    assert "ETA about 2 min, could be 1–6 min" in render.bar(wide)


PRINTED = {
    "progress": 0.3,
    "remaining_s": 700,
    "low_s": 650,
    "high_s": 760,
    "done": 300,
    "total": 1000,
    "unit": "it",
    "rate": 1.0,
    "source": "tqdm",
    "until": "end",
    "target": None,
}


def test_list_get_and_follow_show_the_progress_its_unit_rate_and_source():
    row = render.job_row(job(eta=PRINTED))
    assert "30% tqdm" in row
    detailed = {
        **job(eta=PRINTED),
        "spec": {
            "resource": {"node_count": 1, "gpu_count": 0, "cpu_count": 1},
            "placement": {"allowed": "any", "priority": "normal"},
        },
        "algorithm": {"command": "python train.py"},
    }
    assert "progress   30% (300/1000 it, 1 it/s, from tqdm)" in render.job_detail(detailed)
    assert "30% (300/1000 it, 1 it/s, from tqdm)" in render.bar(job(eta=PRINTED))


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"until": "target", "target": "ahead"}, "to target 11m40s"),
        ({"until": "end", "target": "reached"}, "target reached, ends in 11m40s"),
        ({"until": "target", "target": "reached"}, "target reached"),
        ({"until": "end", "target": "unreachable"}, "target unreachable before the end, ends in 11m40s"),
        ({}, "11m40s"),
    ],
)
def test_the_eta_says_whether_it_runs_to_the_target_and_whether_the_target_was_reached(fields, shown):
    assert render.eta_text(job(eta={**PRINTED, **fields})).startswith(shown)


HOSTILE = "first\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\x9b31m\x7f-job"  # a clipboard write, a screen clear, C1 CSI


def test_text_from_the_server_cannot_drive_the_readers_terminal():
    shown = render.safe(HOSTILE + "\n\tnext\r")
    assert shown == "first\\x1b]52;c;ZWNobyBwd25lZA==\\x07\\x1b[2J\\x9b31m\\x7f-job\n\tnext\\x0d"
    assert render.safe_output("loss 0.5\r\x1b[32mloss 0.4\n") == "loss 0.5\r\\x1b[32mloss 0.4\n"


def test_invisible_characters_that_reorder_or_hide_text_are_shown_escaped_and_joiners_kept():
    """A description or an output line holding a right-to-left override showed its words in another order (it read
    `cod.exe` while holding `exe.doc`): found by review."""
    forged = "report \u202e\u2066cod.exe\u2069\u202c\u200b\ufeff\u2028end"
    assert render.safe(forged) == "report \\u202e\\u2066cod.exe\\u2069\\u202c\\u200b\\ufeff\\u2028end"
    assert render.safe_output("loss \u200f0.5\n") == "loss \\u200f0.5\n"
    kept = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \U0001f468\u200d\U0001f4bb caf\u00e9"  # ZWNJ, ZWJ
    assert render.safe(kept) == kept


def test_a_jobs_detail_and_the_status_lines_show_a_hostile_name_escaped(monkeypatch, capsys):
    from services.cli import follow

    hostile = {**job(), "metadata": {**job()["metadata"], "name": HOSTILE, "description": HOSTILE}}
    detail = render.safe(
        render.job_detail(
            {
                **hostile,
                "algorithm": {"command": "python train.py"},
                "spec": {
                    "resource": {"node_count": 1, "gpu_count": 0, "cpu_count": 1, "memory_gb": None},
                    "placement": {"allowed": "any", "priority": "time"},
                },
            }
        )
    )
    assert "\x1b" not in detail and "\\x1b]52" in detail
    bar = follow.Bar(sys.stderr, full=False)
    bar.show(hostile)
    assert "\x1b" not in capsys.readouterr().err


def test_logs_to_a_terminal_are_made_safe_and_to_a_pipe_or_with_raw_are_as_printed(monkeypatch, capsys):
    from types import SimpleNamespace

    import httpx

    from services.cli import commands
    from services.cli.client import Api

    printed = "step 1\x1b]52;c;eA==\x07 loss 0.5\n"
    api = Api(url="http://api", token="t", transport=httpx.MockTransport(lambda r: httpx.Response(200, text=printed)))
    monkeypatch.setattr(commands, "jobs_path", lambda args, api, job_id: f"/v2/p/training-jobs/{job_id}")
    for tty, raw, expected in (
        (True, False, render.safe_output(printed)),
        (True, True, printed),
        (False, False, printed),
    ):
        monkeypatch.setattr(sys.stdout, "isatty", lambda tty=tty: tty)
        args = SimpleNamespace(job_id="j", task="worker-0", follow=False, json=False, raw=raw)
        assert commands.logs(args, api) == 0
        assert capsys.readouterr().out == expected


def test_a_config_file_others_may_read_with_a_token_in_it_is_said(tmp_path, capsys):
    from services.cli.settings import warn_if_shared

    config = tmp_path / "config.toml"
    config.write_text('url = "http://127.0.0.1:8080"\ntoken = "tm_abc"\n')
    config.chmod(0o644)
    warn_if_shared(config)
    assert "holds a token and others may read it (mode 644): chmod 600" in capsys.readouterr().err
    config.chmod(0o600)
    warn_if_shared(config)
    assert capsys.readouterr().err == ""
