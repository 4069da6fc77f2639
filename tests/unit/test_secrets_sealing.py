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
from tests.conftest import CLUSTER
from tests.factories import job_body
from tests.unit.test_use_cases import submitter

SECRET = "s3cr3t-wandb-key-0123456789"


def test_a_sealed_value_opens_for_its_job_with_its_key_and_any_later_key_list_that_keeps_it():
    old, new = Fernet.generate_key(), Fernet.generate_key()
    sealed = Sealer([old]).seal("j1", {"TOKEN": SECRET, "PEM": "-----BEGIN-----\nx\n"})
    assert SECRET not in sealed
    rotated = Sealer([new, old])  # a new key first: it seals, the old one still opens
    assert rotated.open("j1", sealed) == {"TOKEN": SECRET, "PEM": "-----BEGIN-----\nx\n"}
    assert Sealer([new]).open("j2", rotated.seal("j2", {"A": "b"})) == {"A": "b"}
    with pytest.raises(Unreadable, match="sealed with a key this submitter does not hold"):
        Sealer([new]).open("j1", sealed)
    with pytest.raises(Unreadable):
        Sealer([old]).open("j1", sealed[:-4] + "AAAA")  # altered
    with pytest.raises(Unreadable, match="sealed for another job"):
        Sealer([old]).open("j-other", sealed)  # copied onto another job by someone without the key


def test_a_key_that_is_not_one_is_refused_naming_the_setting_never_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"param\[secrets_keys\] invalid: each key is 32 url-safe") as refused:
        Sealer.configured("not-a-key-at-all", data_dir=tmp_path)
    assert "not-a-key-at-all" not in str(refused.value)
    (tmp_path / KEY_FILE).write_text("\n")  # a key file emptied (a disk that filled up before this version)
    with pytest.raises(ValueError, match=r"param\[secrets_keys\] invalid: .*holds no key"):
        Sealer.configured(None, data_dir=tmp_path)


def test_the_key_file_is_made_once_whole_private_and_never_over_another(tmp_path):
    sealer = Sealer.configured(None, data_dir=tmp_path / "data")
    path = tmp_path / "data" / KEY_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and len(path.read_bytes().strip()) == 44
    sealed = sealer.seal("j", {"TOKEN": SECRET})
    assert Sealer.configured("", data_dir=tmp_path / "data").open("j", sealed) == {"TOKEN": SECRET}  # next start
    assert [p.name for p in (tmp_path / "data").iterdir()] == [KEY_FILE]  # no temporary left
    keys: list[bytes] = []
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        keys.append(key_file(tmp_path / "raced"))

    racers = [threading.Thread(target=race) for _ in range(8)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert len(keys) == 8 and len(set(keys)) == 1  # replicas starting at once on one folder take one key
    assert [p.name for p in (tmp_path / "raced").iterdir()] == [KEY_FILE]


async def test_a_stored_job_holds_its_secrets_sealed_for_it():
    use_cases = submitter()  # with a key of its own, not the key file of the checkout's data directory
    body = job_body(command="true")
    body["algorithm"]["secrets"] = {"TOKEN": SECRET}
    job = await use_cases.submit(SubmitJob(project_id="p", user_name="ana", body=JobCreate.model_validate(body)))
    stored = await use_cases.repo.get("p", job.metadata.id)
    assert isinstance(stored[SECRET_VALUES], str) and SECRET not in repr(stored)
    assert use_cases.sealer.open(job.metadata.id, stored[SECRET_VALUES]) == {"TOKEN": SECRET}


def test_the_stack_gives_the_keys_to_the_submitter_alone(tmp_path):
    from services.stack.processes import Stack, StackSettings

    key = Fernet.generate_key().decode()
    (tmp_path / "c.toml").write_text(CLUSTER)
    stack = Stack(settings=StackSettings(data_dir=tmp_path, secrets_keys=key, cluster_file=tmp_path / "c.toml"))
    assert stack.env_of("submitter")["TRAINMASTER_SECRETS_KEYS"] == key
    assert all("TRAINMASTER_SECRETS_KEYS" not in stack.env_of(s) for s in ("placement", "monitor", "billing"))


async def test_a_database_user_not_allowed_the_agreed_value_starts_the_submitter_said_loudly(caplog):
    """compose: a volume made before `api_sealing` existed gives the submitter's user no right to it; the replicas'
    keys are then not compared (said as an error), rather than the API kept down; any other failure still stops."""
    from pymongo.errors import OperationFailure

    from services.submitter.sealing import Holder, SealedStore

    class Refusing:
        name = "api_sealing"

        def __init__(self, code: int) -> None:
            self.code = code

        async def find_one(self, *args, **kwargs):
            raise OperationFailure("not authorized on trainmaster_submitter", self.code)

    store = SealedStore(Refusing(13), [Holder(Refusing(13))], field=SECRET_VALUES)
    await store.agree(Sealer([Fernet.generate_key()]))
    assert not store.compared and "were not compared" in caplog.text and "api_sealing" in caplog.text
    with pytest.raises(OperationFailure):
        await SealedStore(Refusing(2), [], field=SECRET_VALUES).agree(Sealer([Fernet.generate_key()]))
