"""The v1 dialect takes seed 002's fields and nothing else: unknown keys at any level are named and refused."""

import copy

import pytest
from pydantic import ValidationError

from services.submitter.dialects import V1JobCreate, translate
from services.submitter.errors import field_path
from tests.e2e.test_dialects import SAMPLE_1, SAMPLE_3


def refused(body) -> list[str]:
    with pytest.raises(ValidationError) as info:
        V1JobCreate.model_validate(body)
    return [field_path(tuple(e["loc"])) for e in info.value.errors()]


def sample(**config):
    body = copy.deepcopy(SAMPLE_3)
    body["config"].update(config)
    return body


def test_the_seed_samples_still_list_their_ignored_known_fields():
    _, ignored = translate(V1JobCreate.model_validate(SAMPLE_3))
    assert {"config.volumes", "config.spec_id", "config.dataset_id"} <= set(ignored)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**SAMPLE_1, "surprise": 1}, "surprise"),
        (sample(surprise={"a": {"b": 1}}), "config.surprise"),
        (sample(parameter=[{"label": "lr", "value": "1", "type": "x"}]), "config.parameter.0.type"),
        (
            sample(volumes=[{"nfs": {"id": "1", "src_path": "a", "dest_path": "b", "deep": [[[[1]]]]}}]),
            "config.volumes.0.nfs.deep",
        ),
        (sample(volumes=[{"smb": {}}]), "config.volumes.0.smb"),
        (sample(data_source=[{"dataset_id": "d", "nested": {"x": 1}}]), "config.data_source.0.nested"),
    ],
)
def test_unknown_keys_at_any_level_are_refused_by_name(body, field):
    assert refused(body) == [field]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (sample(worker_server_num=True), "config.worker_server_num"),
        (sample(worker_server_num="1"), "config.worker_server_num"),
        (sample(spec_id=True), "config.spec_id"),
        (sample(create_version="yes"), "config.create_version"),
        (sample(user_command="echo \u0000"), "config.user_command"),
        (sample(log_url="/usr/\u0000"), "config.log_url"),
        ({**SAMPLE_1, "job_desc": "x\u0000"}, "job_desc"),
        (sample(parameter=[{"label": "lr", "value": "1"}] * 101), "config.parameter"),
        (sample(volumes=[{"host_path": {"src_path": "a", "dest_path": "b"}}] * 21), "config.volumes"),
        (sample(app_url="a" * 5000), "config.app_url"),
    ],
)
def test_types_sizes_and_null_bytes_are_bounded(body, field):
    assert refused(body) == [field]
