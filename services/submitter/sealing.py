"""A job's secrets sealed at rest: the submitter stores them encrypted (Fernet: AES-128-CBC with an HMAC-SHA256
tag) and bound to their job, so a copy of its database (a dump, a backup, a database user who reads the jobs
collection) holds no value, and a sealed value copied onto another job does not open.

The key is not in the database: `TRAINMASTER_SECRETS_KEYS` (comma-separated; the first seals, every one opens), else a
key file in the submitter's data directory, made at its first start (0600, whole or not at all, never over another:
replicas starting at once on one data directory take the same key). Replicas on several machines need the setting
(each would otherwise make its own key, and a job sealed by one would not open on another). Rotation, in two steps:
add the new key last and roll it out to every replica, then put it first (it seals from then on); drop the old one
once the jobs sealed with it have ended. Keys are loaded when the submitter starts: a key that cannot be read or is
not a key stops it there, said why."""

import json
import os
import secrets
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

KEY_FILE = "secrets.key"


class Unreadable(Exception):
    """Sealed with a key this submitter does not hold, altered, or sealed for another job."""


class Sealer:
    def __init__(self, keys: list[bytes]) -> None:
        self.fernet = fernet_of(keys)

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
