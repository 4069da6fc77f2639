"""The ModelArts v1 dialect: the seed's (002) own sample requests create jobs that fail with a clear message."""

import httpx
import pytest

from tests.e2e.helpers import get, wait_phase

pytestmark = pytest.mark.e2e

SAMPLE_1 = {
    "job_name": "TestModelArtsJob",
    "job_desc": "This is a ModelArts job",
    "workspace_id": "af261af2218841ec960b01ab3cf1a5fa",
    "config": {
        "worker_server_num": 1,
        "app_url": "/usr/app/",
        "boot_file_url": "/usr/app/boot.py",
        "parameter": [{"label": "learning_rate", "value": "0.01"}, {"label": "batch_size", "value": "32"}],
        "dataset_id": "38277e62-9e59-48f4-8d89-c8cf41622c24",
        "dataset_version_id": "2ff0d6ba-c480-45ae-be41-09a8369bfc90",
        "spec_id": 1,
        "engine_id": 1,
        "train_url": "/usr/train/",
        "log_url": "/usr/log/",
        "model_id": 1,
        "pool_id": "testpool",
    },
}
SAMPLE_2 = {
    "job_name": "TestModelArtsJob2",
    "job_desc": "This is a ModelArts job",
    "workspace_id": "af261af2218841ec960b01ab3cf1a5fa",
    "config": {
        "worker_server_num": 1,
        "data_url": "/usr/data/",
        "app_url": "/usr/app/",
        "boot_file_url": "/usr/app/boot.py",
        "parameter": [{"label": "CUSTOM_PARAM1", "value": "1"}],
        "spec_id": 1,
        "user_command": "bash -x /home/work/run_train.sh python /home/work/user-job-dir/app/mnist/mnist_softmax.py "
        "--data_url /home/work/user-job-dir/app/mnist_data",
        "user_image_url": "100.125.5.235:20202/jobmng/custom-cpu-base:1.0",
        "train_url": "/usr/train/",
        "log_url": "/usr/log/",
        "model_id": 1,
        "pool_id": "testpool",
        "engine_id": 1,
    },
}
# The seed's third sample is its first with NFS and host-path volumes.
SAMPLE_3 = {
    **SAMPLE_1,
    "job_name": "TestModelArtsJob3",
    "config": {
        **SAMPLE_1["config"],
        "volumes": [
            {
                "nfs": {
                    "id": "43b37236-9afa-4855-8174-32254b9562e7",
                    "src_path": "192.168.8.150:/",
                    "dest_path": "/home/work/nas",
                    "read_only": False,
                }
            },
            {"host_path": {"src_path": "/root/work", "dest_path": "/home/mind", "read_only": False}},
        ],
    },
}
COMMON_IGNORED = {
    "config.dataset_id",
    "config.dataset_version_id",
    "config.spec_id",
    "config.engine_id",
    "config.log_url",
    "config.model_id",
    "config.pool_id",
}


@pytest.mark.parametrize(
    ("sample", "ignored", "message"),
    [
        (SAMPLE_1, COMMON_IGNORED, "boot file /usr/app/boot.py (config.boot_file_url) does not exist"),
        (
            SAMPLE_2,
            {
                "config.spec_id",
                "config.engine_id",
                "config.log_url",
                "config.model_id",
                "config.pool_id",
                "config.user_image_url",
                "config.boot_file_url",
            },
            "config.user_command could not start",
        ),
        (SAMPLE_3, COMMON_IGNORED | {"config.volumes"}, "does not exist on this node"),
    ],
    ids=["boot-file", "custom-image", "volumes"],
)
async def test_seed_sample_creates_a_job_that_fails_clearly(api, project, sample, ignored, message):
    response = await api.post(f"/v1/{project}/training-jobs", json=sample)
    assert response.status_code == 200, response.text
    created = response.json()
    assert created["is_success"] is True and created["job_name"] == sample["job_name"]
    assert created["status"] == 1 and created["version_name"] == "V0001" and created["create_time"] > 0
    assert set(created["ignored_fields"]) == ignored

    job = await get(api, project, created["job_id"])
    assert job["metadata"]["workspace_id"] == sample["workspace_id"]
    assert "v1 ignored:" in job["metadata"]["description"]
    assert set(job["algorithm"]["environments"]) >= {"MODELARTS_V1_IGNORED"}
    assert {p["name"] for p in job["algorithm"]["parameters"]} == {p["label"] for p in sample["config"]["parameter"]}

    done = await wait_phase(api, project, created["job_id"], "Failed", "Completed")
    assert done["status"]["phase"] == "Failed"
    assert message in done["status"]["task_statuses"][0]["message"]


async def test_a_taken_name_and_a_bad_field_answer_in_the_v1_shape(api, project):
    first = await api.post(f"/v1/{project}/training-jobs", json=SAMPLE_1)
    assert first.status_code == 200, first.text
    again = await api.post(f"/v1/{project}/training-jobs", json=SAMPLE_1)
    assert again.status_code == 409
    assert again.json()["is_success"] is False and again.json()["error_code"] == "406026"
    assert "already exists" in again.json()["error_message"]

    bad = {**SAMPLE_1, "job_name": "bad name!", "config": {**SAMPLE_1["config"], "worker_server_num": 1}}
    answer = (await api.post(f"/v1/{project}/training-jobs", json=bad)).json()
    assert answer["is_success"] is False and "param[job_name]" in answer["error_msg"]

    no_workers = {**SAMPLE_1, "config": {k: v for k, v in SAMPLE_1["config"].items() if k != "worker_server_num"}}
    answer = (await api.post(f"/v1/{project}/training-jobs", json=no_workers)).json()
    assert answer == {**answer, "is_success": False, "error_code": "406001"}
    assert "config.worker_server_num" in answer["error_msg"]


async def test_v1_needs_a_token(stack):
    async with httpx.AsyncClient(base_url=stack.api_url) as client:
        answer = await client.post("/v1/p/training-jobs", json=SAMPLE_1)
    assert answer.status_code == 401 and answer.json()["is_success"] is False
