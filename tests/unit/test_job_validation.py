import pytest
from pydantic import ValidationError

from shared.jobs import JobCreate, unnamable
from tests.factories import job_body
from tests.unit.api_app import client, make_app


def errors(body):
    with pytest.raises(ValidationError) as info:
        JobCreate.model_validate(body)
    return [".".join(str(p) for p in e["loc"]) for e in info.value.errors()]


def test_defaults():
    job = JobCreate.model_validate(job_body(name="ok_name-1"))
    assert (job.spec.placement.allowed, job.spec.placement.priority) == ("any", "time")


@pytest.mark.parametrize("name", ["", "x" * 65, "has space", "ünï"])
def test_bad_names(name):
    assert errors(job_body(name=name)) == ["metadata.name"]


def test_a_job_without_a_name_gets_one_of_its_own():
    """The README's examples run twice in a row: a name left out is generated, never the same twice."""
    body = job_body()
    del body["metadata"]
    first, second = JobCreate.model_validate(body), JobCreate.model_validate(body)
    assert first.metadata.name.startswith("job-") and first.metadata.name != second.metadata.name
    assert JobCreate.model_validate({**body, "metadata": {}}).metadata.name.startswith("job-")


def test_unknown_fields_are_refused():
    body = job_body()
    body["spec"]["resource"]["gpus"] = 1
    assert errors(body) == ["spec.resource.gpus"]


def test_reserved_environment_and_bad_regex():
    assert errors(job_body(environments={"CUDA_VISIBLE_DEVICES": "0"})) == ["algorithm.environments"]
    assert errors(job_body(metrics=[{"name": "loss", "regex": "loss ("}])) == ["algorithm.metrics.0.regex"]
    assert errors(job_body(metrics=[{"name": "loss", "regex": "loss"}])) == ["algorithm.metrics.0.regex"]


@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "RANK", "TRAINMASTER_CODE_DIR"])
def test_a_parameter_named_as_a_variable_trainmaster_sets_is_unfit_for_a_new_job(name):
    """Parameters reach the task as environment variables too: such a name was taken and then silently overwritten
    by the agent's own value. Refused at submission (`Submitter.prepare`), not by the model: a job stored or in a
    stream before the check still reads back."""
    body = JobCreate.model_validate(job_body(parameters=[{"name": name, "value": "0"}]))
    assert unnamable(body.algorithm)[0] == "algorithm.parameters"


def test_two_inputs_that_are_one_variable_are_unfit_for_a_new_job():
    """`a.b` and `a_b` are both TRAINMASTER_INPUT_A_B: the last one won, silently (found by review)."""
    body = job_body()
    body["algorithm"]["inputs"] = [
        {"name": "data.train", "url": "https://example.org/a"},
        {"name": "data_train", "url": "https://example.org/b"},
    ]
    field, reason = unnamable(JobCreate.model_validate(body).algorithm)
    assert field == "algorithm.inputs" and "'data.train' and 'data_train'" in reason
    body["algorithm"]["inputs"][1]["name"] = "data_eval"
    assert unnamable(JobCreate.model_validate(body).algorithm) is None


async def test_a_submission_with_an_unfit_name_is_refused_naming_the_field():
    app, _, _ = await make_app()
    async with client(app) as admin:
        refused = await admin.post(
            "/v2/vision/training-jobs", json=job_body(name="r", parameters=[{"name": "RANK", "value": "3"}])
        )
    assert refused.status_code == 400 and "param[algorithm.parameters]" in refused.json()["error_msg"], refused.text


def test_gpu_memory_needs_a_gpu():
    assert errors(job_body(min_gpu_memory_gb=16)) == ["spec.resource"]
