"""`trainmaster get` and `trainmaster top`: a job's GPU utilisation and memory now, from its system series only."""

from types import SimpleNamespace

import httpx

from services.cli import commands, render
from services.cli.__main__ import parser
from services.cli.client import Api
from tests.unit.test_cli_render import job

REPORT = {
    "job_id": "j",
    "series": [
        {"name": "gpu_util", "system": False, "points": [[1.0, 3.0, None]]},  # the job printed "gpu_util": not shown
        {"name": "loss", "points": [[1.0, 0.5, 1.0]]},
        {"name": "gpu_util", "system": True, "points": [[1.0, 10.0, None], [2.0, 87.0, None]]},
        {"name": "gpu_memory_gb", "system": True, "points": [[2.0, 12.34, None]]},
        {"name": "gpu_memory_peak_gb", "system": True, "points": [[2.0, 20.1, None]]},
    ],
}


def test_the_gpu_figures_are_the_latest_of_the_system_series_only():
    now = render.gpu_now(REPORT)
    assert now == {"gpu_util": 87.0, "gpu_memory_gb": 12.34, "gpu_memory_peak_gb": 20.1}
    assert render.gpu_text(now) == "87% busy, 12.3 GB (peak 20.1 GB)"
    assert render.gpu_now({"series": [REPORT["series"][0]]}) == {} and render.gpu_text({}) == "-"


def test_get_shows_the_gpus_when_read_and_nothing_otherwise():
    shown = {
        **job(),
        "algorithm": {"command": "python train.py"},
        "spec": {
            "resource": {"node_count": 1, "gpu_count": 1, "cpu_count": 4, "memory_gb": None},
            "placement": {"allowed": "any", "priority": "time"},
        },
    }
    assert "  gpu        87% busy, 12.3 GB (peak 20.1 GB)" in render.job_detail(shown, render.gpu_now(REPORT))
    assert "  gpu " not in render.job_detail(shown)


def api(answers: dict[str, dict], asked: list) -> Api:
    def answer(request: httpx.Request) -> httpx.Response:
        asked.append((request.url.path, dict(request.url.params)))
        return (
            httpx.Response(200, json=answers[request.url.path])
            if request.url.path in answers
            else httpx.Response(404, json={"error_code": "TM.0404", "error_msg": "no such job"})
        )

    return Api(url="http://api", token="t", transport=httpx.MockTransport(answer))


def test_top_lists_running_jobs_with_their_gpus_now(capsys):
    running, quiet = job(name="busy"), job(name="quiet")
    quiet["metadata"]["id"] = "quiet-id"
    asked: list = []
    client = api(
        {
            "/v2/p/training-jobs": {"items": [running, quiet], "total": 2, "offset": 0, "count": 2},
            f"/v2/p/training-jobs/{running['metadata']['id']}/metrics": REPORT,
        },
        asked,
    )
    args = SimpleNamespace(settings=SimpleNamespace(project="p"), json=False, limit=20)
    assert commands.top(args, client) == 0
    busy_row, quiet_row = capsys.readouterr().out.splitlines()[1:]
    assert busy_row.split()[-3:] == ["87%", "12.3", "20.1"] and quiet_row.split()[-3:] == ["-", "-", "-"]
    assert asked[0] == ("/v2/p/training-jobs", {"phase": "Running", "limit": "20"})
    assert asked[1][1] == {"max_points": "1"}
    assert parser().parse_args(["top", "--limit", "5"]).limit == 5


def test_nodes_show_each_gpu_read_at_the_last_heartbeat():
    read = {
        "gpus": [
            {
                "index": 0,
                "model": "A100",
                "memory_gb": 80,
                "tflops": 312,
                "util_percent": 87.4,
                "memory_used_gb": 12.34,
            },
            {"index": 1, "model": "A100", "memory_gb": 80, "tflops": 312, "util_percent": None, "memory_used_gb": None},
        ]
    }
    assert commands.gpus_now(read) == "#0 87% 12.3GB" and commands.gpus_now({"gpus": []}) == "-"
