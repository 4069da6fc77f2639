"""What a job runs with: a cached engine environment built with real pip, code, inputs and outputs."""

import re
import sys
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.e2e.helpers import logs_containing, submit, wait_phase
from tests.factories import job_body

pytestmark = pytest.mark.e2e
ON_RESERVED = {"gpu_count": 1, "gpu_models": ["A100-40GB"]}  # one node, so its engine cache is the one reused


async def test_an_engine_is_prepared_once_per_node_and_reused(api, project, status_log):
    engine = {"name": "six-env", "packages": ["six==1.16.0"]}
    first = await submit(
        api,
        project,
        command="python -c 'import six, sys; print(\"six\", six.__version__, sys.prefix)'",
        engine=engine,
        **ON_RESERVED,
    )
    done = await wait_phase(api, project, first["metadata"]["id"], "Completed", "Failed", timeout_s=240)
    assert done["status"]["phase"] == "Completed", done["status"]
    text = await logs_containing(api, project, first["metadata"]["id"], "six 1.16.0", "preparing engine six-env")
    assert "six 1.16.0" in text and "[trainmaster] preparing engine six-env: pip install six==1.16.0" in text
    assert ("Pending", "Preparing") in status_log.phases[first["metadata"]["id"]]

    second = await submit(
        api,
        project,
        command="python -c 'import six; print(\"six again\", six.__version__)'",
        engine=engine,
        **ON_RESERVED,
    )
    done = await wait_phase(api, project, second["metadata"]["id"], "Completed", "Failed", timeout_s=60)
    assert done["status"]["phase"] == "Completed", done["status"]
    text = await logs_containing(api, project, second["metadata"]["id"], "six again 1.16.0", "ready (cached")
    assert "six again 1.16.0" in text and "ready (cached environment" in text and "preparing engine" not in text
    assert ("Pending", "Preparing") not in status_log.phases[second["metadata"]["id"]]


async def test_a_package_that_does_not_exist_ends_create_failed_with_pips_message(api, project):
    engine = {"packages": ["trainmaster-no-such-package-4f2a==1.0"]}
    job = await submit(api, project, command="true", engine=engine, **ON_RESERVED)
    done = await wait_phase(api, project, job["metadata"]["id"], "Failed", "Completed", timeout_s=240)
    assert (done["status"]["phase"], done["status"]["secondary_phase"]) == ("Failed", "CreateFailed")
    assert "pip install failed" in done["status"]["reason"]
    assert re.search(r"No matching distribution|Could not find a version", done["status"]["reason"])


async def test_code_is_fetched_and_its_boot_file_run(api, project, stack):
    code = project_storage(stack, project) / "code"  # local paths a job may use: its project's storage
    code.mkdir(parents=True)
    (code / "helper.py").write_text("GREETING = 'hello from the code dir'\n")
    (code / "train.py").write_text("import helper\nprint(helper.GREETING)\n")
    job = await submit(api, project, command="", code_dir=f"file://{code}", boot_file="train.py")
    done = await wait_phase(api, project, job["metadata"]["id"], "Completed", "Failed")
    assert done["status"]["phase"] == "Completed", done["status"]
    assert "hello from the code dir" in await logs_containing(
        api, project, job["metadata"]["id"], "hello from the code dir"
    )


# The first attempt runs 10 s, past its first upload and the move; the second, started over, runs its steps at once.
# (A file written in place could be uploaded truncated, empty, by a sync that came mid-write, as under load.)
WRITER = r"""
import os, pathlib, time
data = pathlib.Path(os.environ["TRAINMASTER_INPUT_DATA"], "numbers.txt").read_text().split()
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_MODEL"])
attempt = os.environ["TRAINMASTER_ATTEMPT"]
for step in range(40):  # written whole, then renamed, as a checkpoint is saved: a sync never sees it half-written
    (out / f".attempt-{attempt}.partial").write_text(f"sum {sum(map(int, data))} step {step}\n")
    os.replace(out / f".attempt-{attempt}.partial", out / f"attempt-{attempt}.txt")
    print(f"step {step}", flush=True)
    time.sleep(0.25 if attempt == "1" else 0.02)
"""


async def test_inputs_come_in_and_outputs_go_out_during_the_run_and_across_a_move(api, project, stack):
    inputs, outputs = project_storage(stack, project) / "in", project_storage(stack, project) / "out"
    inputs.mkdir(parents=True)
    (inputs / "numbers.txt").write_text("1 2 3 4\n")
    job = await submit(
        api,
        project,
        command=f"{sys.executable} -c '{WRITER}'",
        allowed="local",
        inputs=[{"name": "data", "url": str(inputs)}],
        outputs=[{"name": "model", "url": f"file://{outputs}", "period_s": 1}],
    )
    job_id = job["metadata"]["id"]
    await wait_phase(api, project, job_id, "Running")
    first = outputs / "attempt-1.txt"
    await eventually(lambda: _exists(first), timeout_s=20)  # uploaded while it runs
    assert first.read_text().startswith("sum 10 step")
    response = await api.post(f"/v2/{project}/training-jobs/{job_id}/actions", json={"action_type": "migrate"})
    assert response.status_code == 202, response.text
    done = await wait_phase(api, project, job_id, "Completed", "Failed", timeout_s=90)
    assert done["status"]["phase"] == "Completed" and len(done["status"]["attempts"]) == 2
    assert (outputs / "attempt-1.txt").exists() and (outputs / "attempt-2.txt").read_text() == "sum 10 step 39\n"


def project_storage(stack, project: str) -> Path:
    """The project's own storage (<storage root>/<project>/), where its jobs may read and write."""
    return stack.data_dir / "storage" / project


async def _exists(path: Path):
    return path.exists()


async def test_flavors_and_pools_are_listed_and_a_pooled_job_stays_in_its_pool(api, project):
    flavors = (await api.get("/v2/flavors")).json()["items"]
    a100 = next(f for f in flavors if f["gpu_model"] == "A100-40GB")
    assert a100["gpu_count"] == 1 and a100["gpu_memory_gb"] == 40 and a100["max_node_count"] >= 1
    pools = {p["pool_id"]: p for p in (await api.get("/v2/pools")).json()["items"]}
    assert pools["lab"]["node_ids"] == ["local-1", "local-2"]
    jobs = [await submit(api, project, command="true", pool_id="lab", cpu_count=0.5) for _ in range(4)]
    for job in jobs:
        done = await wait_phase(api, project, job["metadata"]["id"], "Completed", "Failed")
        assert done["status"]["node_ids"][0] in ("local-1", "local-2")
    flavored = await submit(api, project, command="true", flavor_id=a100["flavor_id"])
    assert flavored["spec"]["resource"]["gpu_count"] == 1 and flavored["spec"]["resource"]["min_gpu_memory_gb"] == 40
    done = await wait_phase(api, project, flavored["metadata"]["id"], "Completed", "Failed")
    assert done["status"]["node_ids"] == ["reserved-1"]
    for field, value in (("pool_id", "nowhere"), ("flavor_id", "no-such-flavor")):
        bad = await api.post(f"/v2/{project}/training-jobs", json=job_body(**{field: value}))
        assert bad.status_code == 400 and f"param[spec.resource.{field}]" in bad.json()["error_msg"]
