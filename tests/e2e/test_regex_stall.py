"""A hostile metric pattern against hostile output lines stalls nothing: /healthz answers within a second."""

import asyncio

import httpx
import pytest

from tests.conftest import eventually
from tests.e2e.helpers import get, logs_containing, submit, wait_phase

pytestmark = pytest.mark.e2e

# 40 a's and a '!' take a backtracking engine hours on (a+)+$; the 10,000-character lines are cut before matching.
FLOOD = (
    'python3 -c "import time\n'
    "for i in range(80):\n"
    "    print('a' * 40 + '!', flush=True)\n"
    "    print('a' * 10000 + '!', flush=True)\n"
    "    print('a' * (i + 20) + 'b', flush=True)\n"
    "    time.sleep(0.05)\n"
    "print('loss 0.5', flush=True)\n"
    "time.sleep(1)\n"
    "print('loss 0.25', flush=True)\n\""
)
METRICS = [{"name": "aaa", "regex": r"(?P<value>a+)+$"}, {"name": "loss", "regex": r"loss (?P<value>[0-9.]+)"}]


async def test_a_catastrophic_pattern_on_long_lines_never_stalls_healthz(api, stack, project):
    job = await submit(api, project, command=FLOOD, metrics=METRICS)
    job_id = job["metadata"]["id"]
    answers = []
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=1.0) as probe:  # a slower answer raises
        while (await get(api, project, job_id))["status"]["phase"] not in ("Completed", "Failed", "Terminated"):
            answers.append((await probe.get("/healthz")).status_code)
            await asyncio.sleep(0.2)
        for _ in range(10):  # the estimator may still be reading the job's last chunks
            answers.append((await probe.get("/healthz")).status_code)
            await asyncio.sleep(0.2)
    done = await wait_phase(api, project, job_id, "Completed", "Failed")
    assert done["status"]["phase"] == "Completed", done["status"]
    assert len(answers) >= 10 and set(answers) == {200}, answers
    assert "a" * 40 + "!" in await logs_containing(api, project, job_id, "loss 0.25")

    async def loss_points():  # the estimator read past the hostile lines to the metric behind them
        report = (await api.get(f"/v2/{project}/training-jobs/{job_id}/metrics")).json()
        return [p[1] for s in report["series"] if s["name"] == "loss" for p in s["points"]] == [0.5, 0.25]

    await eventually(loss_points, timeout_s=20)


def test_a_pattern_re2_refuses_is_a_406001_naming_the_field(stack, admin_headers):
    body = {
        "kind": "job",
        "metadata": {"name": "backref"},
        "algorithm": {"command": "true", "metrics": [{"name": "loss", "regex": r"loss (?P<value>[0-9.]+) \1"}]},
    }
    response = httpx.post(f"{stack.api_url}/v2/p-regex/training-jobs", json=body, headers=admin_headers, timeout=10)
    assert response.status_code == 400
    assert response.json()["error_code"] == "406001"
    assert response.json()["error_msg"].startswith("param[algorithm.metrics.0.regex] invalid: not a valid RE2")
