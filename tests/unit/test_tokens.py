"""Tokens: expiry, listing without secrets, revocation, the admin token's rotation and file, the 32-character rule."""

import asyncio
import os
import stat

import pytest
from pydantic import ValidationError

from shared.buscreds import write_secret
from services.submitter.app import SubmitterSettings
from services.submitter.auth import ADMIN, Tokens, digest
from services.submitter.errors import ApiError
from services.submitter.limits import RateLimiter
from tests.memory import MemoryCollection
from tests.unit.api_app import ADMIN_TOKEN, add_user, client, make_app


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def tokens(clock=None) -> Tokens:
    return Tokens(MemoryCollection("users"), MemoryCollection("tokens"), **({"clock": clock} if clock else {}))


async def test_a_token_stops_working_when_it_expires():
    clock = Clock()
    store = tokens(clock)
    await store.users.insert_one({"_id": "ana", "projects": ["vision"]})
    secret, info = await store.issue("ana", expires_in=3600)
    assert (await store.principal(secret)).user_name == "ana"
    clock.now += 3599
    assert (await store.principal(secret)).token_id == info["token_id"]
    clock.now += 1
    with pytest.raises(ApiError) as refused:
        await store.principal(secret)
    assert (refused.value.status, refused.value.code) == (401, "406039")


async def test_the_list_shows_dates_and_never_the_secret_or_its_hash():
    clock = Clock()
    store = tokens(clock)
    await store.users.insert_one({"_id": "ana", "projects": []})
    secret, _ = await store.issue("ana", expires_in=60)
    await store.issue("ana")
    clock.now += 120
    await store.issue("ana")
    listed = await store.of_user("ana")
    assert [t["expires"] is None for t in listed] == [False, True, True]
    assert listed[0]["created"] == "2027-01-15T08:00:00Z" and listed[0]["last_used"] is None
    text = repr(listed)
    assert secret not in text and digest(secret) not in text


async def test_last_used_is_kept_to_the_minute():
    clock = Clock()
    store = tokens(clock)
    await store.users.insert_one({"_id": "ana", "projects": []})
    secret, _ = await store.issue("ana")
    await store.principal(secret)
    clock.now += 30
    await store.principal(secret)
    assert (await store.of_user("ana"))[0]["last_used"] == "2027-01-15T08:00:00Z"


async def test_a_new_configured_admin_token_revokes_the_previous_one(tmp_path):
    store = tokens()
    first, second = "a" * 32, "b" * 40
    await store.bootstrap_admin(configured=first, data_dir=tmp_path)
    mine, _ = await store.issue(ADMIN)  # one the admin made through the API stays
    assert (await store.principal(first)).is_admin
    await store.bootstrap_admin(configured=second, data_dir=tmp_path)
    assert await store.principal(first) is None
    assert (await store.principal(second)).is_admin and (await store.principal(mine)).is_admin
    assert len(store.revoked_at_start) == 1
    await store.bootstrap_admin(configured=second, data_dir=tmp_path)  # the same again: nothing changes
    assert (await store.principal(second)).is_admin


async def test_without_a_configured_token_one_is_generated_once_into_a_private_file(tmp_path):
    store = tokens()
    await store.bootstrap_admin(configured="c" * 32, data_dir=tmp_path)
    generated = await store.bootstrap_admin(configured=None, data_dir=tmp_path / "data")
    path = tmp_path / "data" / "admin-token"
    assert path.read_text().strip() == generated and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert await store.principal("c" * 32) is None  # the configured one is gone with its setting
    assert await store.bootstrap_admin(configured=None, data_dir=tmp_path / "data") is None  # kept at the next start
    assert (await store.principal(generated)).is_admin


async def test_a_short_admin_token_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="at least 32 characters"):
        SubmitterSettings(admin_token="test-admin-token")
    with pytest.raises(ValueError, match="at least 32"):
        await tokens().bootstrap_admin(configured="x" * 31, data_dir=tmp_path)


def test_the_secret_file_is_created_private_and_replaced_atomically(tmp_path):
    old_umask = os.umask(0)  # even a permissive umask gives 0600
    try:
        path = tmp_path / "admin-token"
        write_secret(path, "first\n")
        write_secret(path, "second\n")
    finally:
        os.umask(old_umask)
    assert path.read_text() == "second\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["admin-token"]  # no temporary file left


async def test_tokens_stored_before_ids_existed_get_one():
    store = tokens()
    await store.tokens.insert_one({"_id": digest("legacy"), "user_name": "ana"})
    await store.prepare()
    assert (await store.tokens.find_one({"_id": digest("legacy")}))["token_id"].startswith("tk_")


# through the API --------------------------------------------------------------------------------------------------


async def test_users_and_tokens_through_the_api():
    app, _, store = await make_app()
    async with client(app) as admin:
        created = await admin.post("/v2/users", json={"user_name": "ana", "projects": ["vision"], "expires_in": 600})
        assert created.status_code == 201, created.text
        ana = created.json()
        assert ana["token_id"].startswith("tk_") and ana["expires"]
        async with client(app, ana["token"]) as as_ana:
            extra = (await as_ana.post("/v2/users/ana/tokens", json={"expires_in": 60})).json()
            listed = (await as_ana.get("/v2/users/ana/tokens")).json()
            assert {t["token_id"] for t in listed["items"]} == {ana["token_id"], extra["token_id"]}
            assert ana["token"] not in str(listed) and digest(ana["token"]) not in str(listed)
            assert (await as_ana.get(f"/v2/users/{ADMIN}/tokens")).status_code == 403
            assert (await as_ana.delete(f"/v2/users/ana/tokens/{extra['token_id']}")).status_code == 204
            assert (await as_ana.delete(f"/v2/users/ana/tokens/{extra['token_id']}")).status_code == 404
        async with client(app, extra["token"]) as revoked:
            gone = await revoked.get("/v2/me")
            assert (gone.status_code, gone.json()["error_code"]) == (401, "406039")
        assert (await admin.delete(f"/v2/users/ana/tokens/{ana['token_id']}")).status_code == 204
        assert (await admin.get("/v2/users/ana/tokens")).json()["count"] == 0


async def test_an_expired_token_gets_401_through_the_api():
    clock = Clock()
    app, _, store = await make_app(clock=clock)
    secret = await add_user(store, "ana", ["vision"], expires_in=10)
    async with client(app, secret) as as_ana:
        assert (await as_ana.get("/v2/me")).status_code == 200
        clock.now += 10
        expired = await as_ana.get("/v2/me")
        assert (expired.status_code, expired.json()["error_code"]) == (401, "406039")
        assert "expired" in expired.json()["error_msg"]
        assert (await as_ana.post("/v2/vision/training-jobs", json={})).status_code == 401


async def test_a_users_own_token_lives_no_longer_than_the_one_he_asks_with():
    clock = Clock()
    app, _, store = await make_app(clock=clock)
    secret = await add_user(store, "ana", ["vision"], expires_in=30 * 86400)  # what the admin gave: 30 days
    given = (await store.tokens.find_one({"user_name": "ana"}))["expires_s"]
    async with client(app, secret) as as_ana:
        forever = (await as_ana.post("/v2/users/ana/tokens", json={})).json()
        longer = (await as_ana.post("/v2/users/ana/tokens", json={"expires_in": 365 * 86400})).json()
        shorter = (await as_ana.post("/v2/users/ana/tokens", json={"expires_in": 60})).json()
    expiries = {d["token_id"]: d["expires_s"] async for d in store.tokens.find({"user_name": "ana"})}
    assert expiries[forever["token_id"]] == expiries[longer["token_id"]] == given
    assert expiries[shorter["token_id"]] == clock.now + 60
    async with client(app) as admin:  # the admin's word is his own
        kept = (await admin.post("/v2/users/ana/tokens", json={})).json()
    assert (await store.tokens.find_one({"token_id": kept["token_id"]}))["expires_s"] is None


async def test_all_tokens_of_one_user_share_one_rate_limit_and_the_admin_has_none():
    app, _, store = await make_app()
    app.state.rate = RateLimiter(rate=0.001, burst=2)
    first, second = await add_user(store, "ana", ["vision"]), (await store.issue("ana"))[0]
    other = await add_user(store, "ben", ["vision"])
    async with client(app, first) as one, client(app, second) as two, client(app, other) as ben, client(app) as admin:
        assert [(await one.get("/v2/me")).status_code for _ in range(2)] == [200, 200]
        refused = await two.get("/v2/me")  # a second token is not a second allowance
        assert (refused.status_code, refused.json()["error_code"]) == (429, "406042"), refused.text
        assert "user ana" in refused.json()["error_msg"] and int(refused.headers["Retry-After"]) >= 1
        assert (await ben.get("/v2/me")).status_code == 200  # another user has his own
        assert {(await admin.get("/v2/me")).status_code for _ in range(5)} == {200}


async def test_a_user_holds_at_most_the_cap_of_live_tokens():
    clock = Clock()
    app, _, store = await make_app(clock=clock)
    store.max_per_user = 3
    secret = await add_user(store, "ana", ["vision"])
    async with client(app, secret) as as_ana, client(app) as admin:
        short = (await as_ana.post("/v2/users/ana/tokens", json={"expires_in": 60})).json()
        assert (await admin.post("/v2/users/ana/tokens")).status_code == 201
        for asker in (as_ana, admin):  # the admin issuing for her counts the same
            refused = await asker.post("/v2/users/ana/tokens")
            assert (refused.status_code, refused.json()["error_code"]) == (409, "406035"), refused.text
            assert refused.json()["error_msg"].startswith(
                "param[user_name] invalid: the live token quantity of user ana has reached the upper limit (3 of 3"
            )
        assert (await as_ana.get("/v2/users/ana/tokens")).json()["count"] == 3
        clock.now += 60  # an expired token no longer counts
        assert (await as_ana.post("/v2/users/ana/tokens")).status_code == 201
        assert (await as_ana.post("/v2/users/ana/tokens")).status_code == 409
        assert (await as_ana.delete(f"/v2/users/ana/tokens/{short['token_id']}")).status_code == 204
        assert (await as_ana.post("/v2/users/ana/tokens")).status_code == 409  # the expired one was not live
        listed = (await as_ana.get("/v2/users/ana/tokens")).json()["items"]
        assert (await as_ana.delete(f"/v2/users/ana/tokens/{listed[-1]['token_id']}")).status_code == 204
        assert (await as_ana.post("/v2/users/ana/tokens")).status_code == 201  # a revoked one frees its place
        assert {(await admin.post(f"/v2/users/{ADMIN}/tokens")).status_code for _ in range(4)} == {201}


@pytest.mark.parametrize(
    "body, field",
    [
        ({"expires_in": True}, "expires_in"),
        ({"expires_in": "60"}, "expires_in"),
        ({"expires_in": 0}, "expires_in"),
        ({"expires_in": 1.5}, "expires_in"),
        ({"expires_in": 60, "scope": "all"}, "scope"),
    ],
)
async def test_a_bad_expiry_is_refused_naming_the_field(body, field):
    app, _, _ = await make_app()
    async with client(app) as admin:
        response = await admin.post("/v2/users/admin/tokens", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error_msg"].startswith(f"param[{field}] invalid")


def test_no_other_short_admin_token_is_left_in_the_tests():
    from tests.conftest import ADMIN_TOKEN as STACK_TOKEN

    assert len(STACK_TOKEN) >= 32 and len(ADMIN_TOKEN) >= 32


class CountingCollection(MemoryCollection):
    """Counts the reads by id, as the database would see them."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.reads = 0

    async def find_one(self, query: dict, projection: dict | None = None) -> dict | None:
        self.reads += 1
        return await super().find_one(query, projection)


async def test_a_token_checked_again_within_the_cache_time_costs_no_read():
    clock = Clock()
    store = Tokens(CountingCollection("users"), CountingCollection("tokens"), clock=clock)
    await store.users.insert_one({"_id": "ana", "projects": ["vision"]})
    secret, _ = await store.issue("ana")
    for _ in range(3):
        assert (await store.principal(secret)).projects == {"vision"}
        clock.now += 1
    assert (store.tokens.reads, store.users.reads) == (1, 1)
    clock.now += store.cache_s
    await store.principal(secret)
    assert (store.tokens.reads, store.users.reads) == (2, 2)


async def test_a_revoked_token_stops_at_once_though_it_was_just_used():
    clock = Clock()
    store = tokens(clock)
    await store.users.insert_one({"_id": "ana", "projects": []})
    secret, info = await store.issue("ana")
    assert await store.principal(secret) is not None
    assert await store.revoke("ana", info["token_id"])
    assert await store.principal(secret) is None
    assert not await store.revoke("ana", info["token_id"])


async def test_a_remembered_token_still_expires_on_time():
    clock = Clock()
    store = tokens(clock)
    await store.users.insert_one({"_id": "ana", "projects": []})
    secret, _ = await store.issue("ana", expires_in=2)
    assert await store.principal(secret) is not None
    clock.now += 2  # within the cache time: the stored expiry still holds
    with pytest.raises(ApiError):
        await store.principal(secret)


async def test_a_token_deleted_or_a_user_disabled_elsewhere_stops_within_the_cache_time():
    """What another API replica did reaches this one when its copy is older than `cache_s`, not later."""
    clock = Clock()
    store = tokens(clock)
    await store.users.insert_one({"_id": "ana", "projects": []})
    await store.users.insert_one({"_id": "bo", "projects": []})
    ana, _ = await store.issue("ana")
    bo, _ = await store.issue("bo")
    assert await store.principal(ana) and await store.principal(bo)
    await store.tokens.delete_one({"_id": digest(ana)})
    await store.users.update_one({"_id": "bo"}, {"$set": {"disabled": True}})
    clock.now += store.cache_s
    assert await store.principal(ana) is None and await store.principal(bo) is None


def test_a_secret_is_on_disk_before_it_replaces_the_old_one_and_the_rename_is_synced(tmp_path, monkeypatch):
    """A power loss must not leave an empty or old minter.json (its revocations exist nowhere else): the file's
    data is synced before the rename, and the folder after it."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    real_replace = os.replace

    def replace(src, dst):
        synced.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_secret(tmp_path / "bus" / "minter.json", "{}")
    assert synced == ["file", "rename", "folder"]
    assert (tmp_path / "bus" / "minter.json").read_text() == "{}"


async def test_two_replicas_starting_together_both_start_with_the_configured_admin_token(tmp_path):
    """Each replica reads the token absent, then one stores it first: the other's insert meets it and starts all
    the same (it raised DuplicateKeyError, and that API replica exited at startup)."""
    users, stored = MemoryCollection("users"), MemoryCollection("tokens")

    class ReadBeforeTheOther(MemoryCollection):  # the second replica's read came before the first one's insert
        async def find_one(self, query: dict, projection: dict | None = None):
            return None if "_id" in query else await stored.find_one(query, projection)

        async def insert_one(self, doc: dict):
            return await stored.insert_one(doc)

        def find(self, *args, **kwargs):
            return stored.find(*args, **kwargs)

    configured = "d" * 32
    await Tokens(users, stored).bootstrap_admin(configured=configured, data_dir=tmp_path)
    second = Tokens(users, ReadBeforeTheOther("tokens"))
    assert await second.bootstrap_admin(configured=configured, data_dir=tmp_path) is None
    assert [d["_id"] for d in stored.docs.values()] == [digest(configured)]


async def test_two_replicas_generating_the_admin_token_together_leave_a_working_one_on_file(tmp_path):
    """The first replica stored its generated token and was writing the file when the second read the token as a
    stale one not on file, revoked it and made its own; the first then wrote its revoked token to the file."""
    users, stored = MemoryCollection("users"), MemoryCollection("tokens")
    first, second = Tokens(users, stored), Tokens(users, stored)
    real_issue = first.issue

    async def slow_issue(*args, **kwargs):  # the first one's file is written a moment after its token is stored
        got = await real_issue(*args, **kwargs)
        await asyncio.sleep(0.2)
        return got

    first.issue = slow_issue  # type: ignore[method-assign]
    one = asyncio.ensure_future(first.bootstrap_admin(configured=None, data_dir=tmp_path))
    await asyncio.sleep(0.05)
    other = await second.bootstrap_admin(configured=None, data_dir=tmp_path)
    generated = await one
    on_file = (tmp_path / "admin-token").read_text().strip()
    assert (await second.principal(on_file)).is_admin and (await first.principal(on_file)).is_admin
    assert [g for g in (generated, other) if g] == [on_file]  # one made it, the other found it on file


def test_an_empty_admin_token_setting_is_unset(monkeypatch, tmp_path):
    """Compose passes an unset TRAINMASTER_ADMIN_TOKEN as an empty string, which was refused as too short: the API
    did not start unless the operator set a token (found by review)."""
    from services.submitter.app import SubmitterSettings

    monkeypatch.setenv("TRAINMASTER_ADMIN_TOKEN", "")
    assert SubmitterSettings(data_dir=tmp_path).admin_token is None
    monkeypatch.setenv("TRAINMASTER_ADMIN_TOKEN", "short")
    with pytest.raises(ValueError, match="at least"):
        SubmitterSettings(data_dir=tmp_path)
