"""A job's secrets are stored sealed (services/submitter/sealing.py): a copy of the database holds no value."""

import os
import stat
import threading

import pytest
from cryptography.fernet import Fernet

from shared.jobs import JobCreate
from services.submitter.sealing import KEY_FILE, Sealer, Unreadable, key_file
from services.submitter.usecases import SubmitJob
from services.submitter.views import SECRET_VALUES
from tests.factories import job_body
from tests.unit.test_use_cases import submitter

SECRET = "s3cr3t-wandb-key-0123456789"


def test_a_sealed_value_opens_with_its_key_and_any_later_key_list_that_keeps_it():
    old, new = Fernet.generate_key(), Fernet.generate_key()
    sealed = Sealer([old]).seal({"TOKEN": SECRET, "PEM": "-----BEGIN-----\nx\n"})
    assert SECRET not in sealed
    rotated = Sealer([new, old])  # a new key first: it seals, the old one still opens
    assert rotated.open(sealed) == {"TOKEN": SECRET, "PEM": "-----BEGIN-----\nx\n"}
    assert Sealer([new]).open(rotated.seal({"A": "b"})) == {"A": "b"}
    with pytest.raises(Unreadable, match="sealed with a key this submitter does not hold"):
        Sealer([new]).open(sealed)
    with pytest.raises(Unreadable):
        Sealer([old]).open(sealed[:-4] + "AAAA")  # altered


def test_a_key_that_is_not_one_is_refused_naming_the_setting_never_the_key():
    with pytest.raises(ValueError, match=r"param\[secrets_keys\] invalid: each key is 32 url-safe") as refused:
        Sealer.configured("not-a-key-at-all", data_dir=None)  # type: ignore[arg-type]
    assert "not-a-key-at-all" not in str(refused.value)


def test_the_key_file_is_made_once_private_and_never_over_another(tmp_path):
    sealer = Sealer.configured(None, data_dir=tmp_path / "data")
    assert not (tmp_path / "data").exists()  # nothing made until a job's secrets need it
    sealed = sealer.seal({"TOKEN": SECRET})
    path = tmp_path / "data" / KEY_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Sealer.configured("", data_dir=tmp_path / "data").open(sealed) == {"TOKEN": SECRET}  # the next start
    keys: list[bytes] = []
    racers = [threading.Thread(target=lambda: keys.append(key_file(tmp_path / "raced"))) for _ in range(8)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert len(set(keys)) == 1  # replicas starting at once on one folder take one key


async def test_a_stored_job_holds_its_secrets_sealed():
    use_cases = submitter()
    use_cases.sealer = Sealer([Fernet.generate_key()])  # not the key file of the checkout's data directory
    body = job_body(command="true")
    body["algorithm"]["secrets"] = {"TOKEN": SECRET}
    job = await use_cases.submit(SubmitJob(project_id="p", user_name="ana", body=JobCreate.model_validate(body)))
    stored = await use_cases.repo.get("p", job.metadata.id)
    assert isinstance(stored[SECRET_VALUES], str) and SECRET not in repr(stored)
    assert use_cases.sealer.open(stored[SECRET_VALUES]) == {"TOKEN": SECRET}
