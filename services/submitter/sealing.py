"""A job's secrets sealed at rest: the submitter stores them encrypted (Fernet: AES-128-CBC with an HMAC-SHA256
tag) and bound to their job, so a copy of its database (a dump, a backup, a database user who reads the jobs
collection) holds no value, and a sealed value copied onto another job does not open.

The key is not in the database: `TRAINMASTER_SECRETS_KEYS` (comma-separated; the first seals, every one opens), else a
key file in the submitter's data directory, made at its first start (0600, whole or not at all, never over another:
replicas starting at once on one data directory take the same key). Replicas on several machines need the setting
(each would otherwise make its own key, and a job sealed by one would not open on another): the database keeps a
value sealed by the first replica's key, and a replica whose keys do not open it stops at its start, said why,
before it accepts a job no other replica could open (`SealedStore.agree`). Rotation, in two steps: add the new key
last and roll it out to every replica, then put it first (it seals from then on); each replica, once started, seals
again with its first key every live job's and search's secrets sealed with an older one (`SealedStore.reseal`, in
the background), so the old key may be dropped once the last replica started with the new one first has logged
that it did. Keys are loaded when the submitter starts: a key that cannot be read or is not a key stops it there,
said why."""

import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from pymongo.errors import DuplicateKeyError, OperationFailure

log = logging.getLogger(__name__)

KEY_FILE = "secrets.key"
AGREED = "secrets-keys"  # the record (its `_id`) of the value every replica's keys must open
RESEAL_BATCH = 200  # live jobs read at a time when their secrets are sealed again
UNAUTHORIZED = 13  # MongoDB's code for a command the user's role does not allow
AGREE_LOOKS = 20  # live sealed secrets of each kind looked at where no agreed value is stored yet


class Unreadable(Exception):
    """Sealed with a key this submitter does not hold, altered, or sealed for another job."""


class Sealer:
    def __init__(self, keys: list[bytes]) -> None:
        self.fernet = fernet_of(keys)
        self.first = Fernet(keys[0])  # the key that seals
        self.older = len(keys) > 1  # keys that only open (a rotation under way)

    def holds_key_of(self, sealed: str) -> bool:
        """Whether a key of this submitter opens `sealed` (whatever job it was sealed for)."""
        return _decrypts(self.fernet, sealed)

    def sealed_by_first(self, sealed: str) -> bool:
        return _decrypts(self.first, sealed)

    def reseal(self, sealed: str) -> str:
        """`sealed` sealed again with the first key (what it holds and whom it is for unchanged); `Unreadable` where
        no key of this submitter opens it."""
        try:
            return self.fernet.rotate(sealed.encode()).decode()
        except InvalidToken:
            raise Unreadable("its secrets were sealed with a key this submitter does not hold") from None

    def seal(self, job_id: str, values: dict[str, str]) -> str:
        return self.fernet.encrypt(json.dumps({"job": job_id, "values": values}).encode()).decode()

    def open(self, job_id: str, sealed: str) -> dict[str, str]:
        try:
            opened = json.loads(self.fernet.decrypt(sealed.encode()))
        except (InvalidToken, ValueError):
            raise Unreadable("its secrets were sealed with a key this submitter does not hold") from None
        if not isinstance(opened, dict) or opened.get("job") != job_id or not isinstance(opened.get("values"), dict):
            raise Unreadable("its stored secrets were sealed for another job") from None
        return {str(k): str(v) for k, v in opened["values"].items()}

    @classmethod
    def configured(cls, keys: str | None, *, data_dir: Path) -> "Sealer":
        """The keys given (comma-separated), else the data directory's key file (made when missing)."""
        if keys and keys.strip():
            return cls([k.strip().encode() for k in keys.split(",") if k.strip()])
        return cls([key_file(data_dir)])


def _decrypts(fernet: Fernet | MultiFernet, sealed: str) -> bool:
    try:
        fernet.decrypt(sealed.encode())
    except InvalidToken:
        return False
    return True


def fernet_of(keys: list[bytes]) -> MultiFernet:
    if not keys:
        raise ValueError("param[secrets_keys] invalid: at least one key")
    try:
        return MultiFernet([Fernet(key) for key in keys])
    except ValueError:  # the library's message names no key; neither does this one
        raise ValueError(
            "param[secrets_keys] invalid: each key is 32 url-safe base64-encoded bytes "
            "(python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')"
        ) from None


def key_file(data_dir: Path) -> bytes:
    """The data directory's key; made at the first start: written whole under a name of its own, synced, then
    linked to its name (which fails where another process made it first: that one is read), so no process ever
    reads a key half written, and a crash leaves none."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = data_dir / KEY_FILE
    if not path.exists():
        temporary = data_dir / f".{KEY_FILE}.{secrets.token_hex(4)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, Fernet.generate_key() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temporary, path)
            folder = os.open(data_dir, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        except FileExistsError:
            pass  # another process made it first
        finally:
            temporary.unlink(missing_ok=True)
    key = path.read_bytes().strip()
    if not key:
        raise ValueError(
            f"param[secrets_keys] invalid: {path} holds no key (remove it, or set TRAINMASTER_SECRETS_KEYS)"
        )
    return key


@dataclass(frozen=True)
class Holder:
    """A collection whose documents keep sealed secrets (a string while they are live, else `{}` or nothing), and
    the field a write must increase, where its documents are replaced whole under a version check (a search's: its
    driver would otherwise write the value it read back over the one sealed again)."""

    collection: Any
    version: str | None = None


@dataclass
class SealedStore:
    """The database's side of sealing: the value every replica's keys must open (`records`) and the documents that
    keep sealed secrets (`holders`, each in its `field`: jobs', searches')."""

    records: Any
    holders: list[Holder]
    field: str
    compared: bool = True  # whether `agree` could read and write the agreed value

    async def agree(self, sealer: Sealer) -> None:
        """`_agree`, where this submitter's database user may use `api_sealing`: one made before it existed (compose,
        an existing volume: docs/security.md) is not stopped, said loudly, and its replicas are not compared."""
        try:
            await self._agree(sealer)
        except OperationFailure as exc:
            if exc.code != UNAUTHORIZED:
                raise
            log.error(
                "the keys that seal jobs' secrets were not compared with the other replicas': this database user "
                "may not use %s (grant it: docs/security.md, 'Database access'): %s",
                self.records.name,
                exc,
            )
            self.compared = False

    async def _agree(self, sealer: Sealer) -> None:
        """Stop the start (`ValueError`, naming the setting) where this submitter's keys do not open what the
        database's secrets were sealed with: the agreed value (made by the first submitter to start, sealed with
        its first key), or where there is none yet (an upgrade), the live sealed secrets, of which these keys must
        open at least one (of the first `AGREE_LOOKS`; one left sealed with a key dropped since fails only its own
        job's start, as before). A replica on another machine that made its own key file would otherwise accept
        jobs no other replica could open, and fail the starts of every job the others sealed. An agreed value that
        is not one (altered by hand) is replaced."""
        found = await self.records.find_one({"_id": AGREED})
        if found is None or not _sealed(found):
            await self._agree_with_live(sealer)
            made = {"_id": AGREED, "sealed": sealer.seal(AGREED, {})}
            try:
                if found is None:
                    await self.records.insert_one(made)
                else:
                    log.warning("the stored value every replica's keys must open was not one: made again")
                    await self.records.replace_one({"_id": AGREED, "sealed": found.get("sealed")}, made)
            except DuplicateKeyError:  # another replica made it first: this one's keys must open it
                pass
            found = await self.records.find_one({"_id": AGREED})
        if found is not None and not sealer.holds_key_of(str(found.get("sealed", ""))):
            raise _refused("the value every replica's keys must open")

    async def _agree_with_live(self, sealer: Sealer) -> None:
        looked: list[str] = []
        for holder in self.holders:
            query = {self.field: {"$type": "string"}}
            async for doc in holder.collection.find(query, {self.field: 1}).limit(AGREE_LOOKS):
                if doc[self.field]:
                    if sealer.holds_key_of(doc[self.field]):
                        return
                    looked.append(str(doc["_id"]))
        if looked:
            raise _refused(f"the secrets of {', '.join(looked[:3])}{' ...' if len(looked) > 3 else ''}")

    async def reseal(self, sealer: Sealer) -> int:
        """Seal again with the first key every live secret and the agreed value, where an older key sealed them;
        how many documents. Each write is conditional on the value read, so one that ended meanwhile (its secrets
        removed) or another replica sealed again is left as it is. A value no key of this submitter opens is left
        for the one that holds its key, said so. With one key (no rotation under way) nothing could be sealed
        again: nothing is read."""
        if not sealer.older:
            return 0
        done = sum([await self._reseal_in(holder, self.field, sealer) for holder in self.holders])
        if self.compared:  # (not: this replica's user may not read it)
            await self._reseal_in(Holder(self.records), "sealed", sealer)
        log.info(
            "secrets sealed again with the first key: %d live jobs and searches; none this replica opens is left "
            "sealed with an older key",
            done,
        )
        return done

    @staticmethod
    async def _reseal_in(holder: Holder, field: str, sealer: Sealer) -> int:
        """Seal again with the first key the live values (`field`, a string) of `holder` an older key sealed; how
        many. Each write is conditional on the value read; a value no key of this submitter opens is left, said."""
        done = 0
        async for doc in holder.collection.find({field: {"$type": "string"}}, {field: 1}, batch_size=RESEAL_BATCH):
            sealed = doc[field]
            if not sealed or sealer.sealed_by_first(sealed):
                continue
            try:
                again = sealer.reseal(sealed)
            except Unreadable:
                log.warning("%s's secrets are sealed with a key this submitter does not hold", doc["_id"])
                continue
            change: dict[str, Any] = {"$set": {field: again}}
            if holder.version is not None:
                change["$inc"] = {holder.version: 1}
            done += (await holder.collection.update_one({"_id": doc["_id"], field: sealed}, change)).modified_count
        return done


def _sealed(record: dict) -> bool:
    return isinstance(record.get("sealed"), str) and bool(record["sealed"])


def _refused(what: str) -> ValueError:
    return ValueError(
        f"param[secrets_keys] invalid: these keys do not open {what} in this database (sealed by another "
        "submitter's key: a replica on another machine makes its own key file); give every replica the same "
        "TRAINMASTER_SECRETS_KEYS"
    )
