"""The README's first job, exactly as the README shows it, and the PyTorch example as its docs say, both run to
Completed on the stack's cluster (its default engine is the project's environment); a follower of the first job's
output sees its last line, printed just before it exited."""

import json
import shlex
from pathlib import Path

from tests.e2e.helpers import wait_phase

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_first_job() -> dict:
    """The body of the README's first `curl ... /training-jobs -d '...'` under "Your first job"."""
    section = README.read_text().split("## Your first job", 1)[1]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    words = shlex.split(block.replace("\\\n", " "), comments=True)
    at = next(i for i, w in enumerate(words) if w.endswith("/training-jobs") and words[i + 1] == "-d")
    return json.loads(words[at + 2].removesuffix(";"))  # `-d '{...}'; echo`


async def test_the_readme_first_job_and_the_pytorch_example_complete_as_written(api, project):
    first = readme_first_job()
    example = {
        "kind": "job",
        "metadata": {"name": "pytorch-example"},
        "algorithm": {
            "command": "python3 -m trainmaster_examples.pytorch_train --steps 100",
            "environments": {"OMP_NUM_THREADS": "1"},  # a tiny model: threads only contend on a small test machine
            "metrics": [{"name": "loss", "regex": "loss (?P<value>[0-9.e-]+)", "target": 0.01}],
        },
        "spec": {
            "resource": {"node_count": 1, "gpu_count": 1, "cpu_count": 1, "memory_gb": 4},
            "placement": {"allowed": "local", "expected_duration_s": 600},
        },
    }
    ids = []
    for body in (first, example):
        response = await api.post(f"/v2/{project}/training-jobs", json=body)
        assert response.status_code == 201, response.text
        ids.append(response.json()["metadata"]["id"])
    async with api.stream(
        "GET", f"/v2/{project}/training-jobs/{ids[0]}/logs", params={"follow": "true"}, timeout=60
    ) as followed:
        text = "".join([part async for part in followed.aiter_text()])
    assert text.splitlines()[-1] == "step 59 loss 0.0167", text[-500:]  # printed just before it exited
    for job_id in ids:
        try:
            done = await wait_phase(api, project, job_id, "Completed", "Failed", timeout_s=60)
        except AssertionError:
            job = (await api.get(f"/v2/{project}/training-jobs/{job_id}")).json()
            output = (await api.get(f"/v2/{project}/training-jobs/{job_id}/logs")).text
            raise AssertionError(f"{job['status']}\n{output[-1500:]}") from None
        assert done["status"]["phase"] == "Completed", done["status"]
    output = (await api.get(f"/v2/{project}/training-jobs/{ids[1]}/logs")).text
    assert "step 99 loss" in output and "No module named" not in output
