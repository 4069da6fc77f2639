"""Replicas of the submitter agree on the keys that seal a job's secrets, and a rotation seals the live jobs' secrets
again (services/submitter/sealing.py `SealedStore`), on the embedded database the stack runs."""

import asyncio

import pytest
from cryptography.fernet import Fernet
from pymongo import AsyncMongoClient

from services.submitter.sealing import AGREED, Holder, SealedStore, Sealer
from services.submitter.views import SECRET_VALUES
from tests.integration.embedded import embedded_database

pytestmark = pytest.mark.integration
SECRET = "hf_0123456789abcdef"


@pytest.fixture
async def db(tmp_path):
    with embedded_database(tmp_path / "db") as url:
        client: AsyncMongoClient = AsyncMongoClient(url)
        try:
            yield client.trainmaster_submitter
        finally:
            await client.close()


def store(db) -> SealedStore:
    return SealedStore(db.api_sealing, [Holder(db.api_jobs), Holder(db.api_searches, version="version")], SECRET_VALUES)


async def test_a_replica_whose_keys_do_not_open_what_the_others_sealed_does_not_start(db):
    first, other = Fernet.generate_key(), Fernet.generate_key()
    sealer = Sealer([first])
    # two replicas of one deployment starting at once: one makes the record, the other's keys open it
    await asyncio.gather(*(store(db).agree(Sealer([first])) for _ in range(2)))
    assert sealer.open(AGREED, (await db.api_sealing.find_one({"_id": AGREED}))["sealed"]) == {}
    await store(db).agree(Sealer([other, first]))  # a rotation's keys
    with pytest.raises(ValueError, match=r"param\[secrets_keys\] invalid: .*TRAINMASTER_SECRETS_KEYS") as stopped:
        await store(db).agree(Sealer([other]))  # its own key file
    assert other.decode() not in str(stopped.value) and first.decode() not in str(stopped.value)


async def test_before_any_record_a_live_jobs_sealed_secrets_are_what_the_keys_must_open(db):
    # a deployment of the version before the record: its live jobs' secrets were sealed with the key it had
    old = Fernet.generate_key()
    await db.api_jobs.insert_many(
        [
            {"_id": "ended", SECRET_VALUES: {}},
            {"_id": "plain"},
            {"_id": "live", SECRET_VALUES: Sealer([old]).seal("live", {"TOKEN": SECRET})},
        ]
    )
    with pytest.raises(ValueError, match=r"do not open the secrets of live"):
        await store(db).agree(Sealer([Fernet.generate_key()]))
    assert await db.api_sealing.find_one({"_id": AGREED}) is None  # nothing recorded by the refused keys
    await store(db).agree(Sealer([old]))
    assert await db.api_sealing.find_one({"_id": AGREED}) is not None


async def test_a_rotation_seals_every_live_jobs_secrets_again_with_the_first_key_and_leaves_the_rest(db):
    old, new, unknown = Fernet.generate_key(), Fernet.generate_key(), Fernet.generate_key()
    await store(db).agree(Sealer([old]))
    stranger = Sealer([unknown]).seal("stranger", {"TOKEN": "x"})
    await db.api_jobs.insert_many(
        [
            *(
                {"_id": f"live-{i}", SECRET_VALUES: Sealer([old]).seal(f"live-{i}", {"TOKEN": f"{SECRET}{i}"})}
                for i in range(5)
            ),
            {"_id": "fresh", SECRET_VALUES: Sealer([new]).seal("fresh", {"TOKEN": SECRET})},
            {"_id": "ended", SECRET_VALUES: {}},
            {"_id": "plain", "name": "no secrets"},
            {"_id": "stranger", SECRET_VALUES: stranger},
        ]
    )
    await db.api_searches.insert_one(
        {"_id": "s-1", "version": 3, SECRET_VALUES: Sealer([old]).seal("s-1", {"TOKEN": SECRET})}
    )
    rotated = Sealer([new, old])
    assert await store(db).reseal(rotated) == 6
    only_new = Sealer([new])
    for i in range(5):
        job = await db.api_jobs.find_one({"_id": f"live-{i}"})
        assert only_new.open(f"live-{i}", job[SECRET_VALUES]) == {"TOKEN": f"{SECRET}{i}"}
    search = await db.api_searches.find_one({"_id": "s-1"})
    assert only_new.open("s-1", search[SECRET_VALUES]) == {"TOKEN": SECRET} and search["version"] == 4  # its driver's
    assert only_new.open(AGREED, (await db.api_sealing.find_one({"_id": AGREED}))["sealed"]) == {}
    assert (await db.api_jobs.find_one({"_id": "ended"}))[SECRET_VALUES] == {}
    assert (await db.api_jobs.find_one({"_id": "stranger"}))[SECRET_VALUES] == stranger  # not its to open
    assert SECRET_VALUES not in await db.api_jobs.find_one({"_id": "plain"})
    assert await store(db).reseal(rotated) == 0  # nothing older is left
    await store(db).agree(only_new)  # the old key may now be dropped


async def test_a_stray_value_sealed_with_a_dropped_key_or_an_altered_record_does_not_stop_a_start(db):
    key, dropped = Fernet.generate_key(), Fernet.generate_key()
    await db.api_jobs.insert_many(
        [
            {"_id": "stray", SECRET_VALUES: Sealer([dropped]).seal("stray", {"A": "bbbb"})},  # its job alone fails
            {"_id": "live", SECRET_VALUES: Sealer([key]).seal("live", {"A": "cccc"})},
        ]
    )
    await store(db).agree(Sealer([key]))
    await db.api_sealing.update_one({"_id": AGREED}, {"$unset": {"sealed": ""}})  # altered by hand
    assert "sealed" not in await db.api_sealing.find_one({"_id": AGREED})
    await store(db).agree(Sealer([key]))
    assert Sealer([key]).open(AGREED, (await db.api_sealing.find_one({"_id": AGREED}))["sealed"]) == {}
    with pytest.raises(ValueError, match="TRAINMASTER_SECRETS_KEYS"):
        await store(db).agree(Sealer([dropped]))
