"""A job's secrets sealed at rest: the submitter stores them encrypted (Fernet: AES-128-CBC with an HMAC-SHA256
tag), so a copy of its database (a dump, a backup, a replica's disk, a database user who reads the jobs collection)
holds no value. The key is not in the database: `TRAINMASTER_SECRETS_KEYS` (comma-separated, the first seals, every
one opens: a new key goes first, the old one stays until the jobs sealed with it ended), else a key file in the
submitter's data directory, made at its first start (0600, never overwritten: two replicas starting at once
on one data directory take the same key)."""

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

KEY_FILE = "secrets.key"


class Unreadable(Exception):
    """Sealed with a key this submitter does not hold (or altered)."""


class Sealer:
    """Keys given are checked at once; keys to load (the key file) are loaded at the first seal or open, so a
    submitter whose jobs carry no secrets never makes one."""

    def __init__(self, keys: list[bytes] | Callable[[], list[bytes]]) -> None:
        self._load = keys if callable(keys) else None
        self._fernet = None if callable(keys) else fernet_of(keys)

    @property
    def fernet(self) -> MultiFernet:
        if self._fernet is None:
            assert self._load is not None
            self._fernet = fernet_of(self._load())
        return self._fernet

    def seal(self, values: dict[str, str]) -> str:
        return self.fernet.encrypt(json.dumps(values).encode()).decode()

    def open(self, sealed: str) -> dict[str, str]:
        try:
            values = json.loads(self.fernet.decrypt(sealed.encode()))
        except (InvalidToken, ValueError):
            raise Unreadable("its secrets were sealed with a key this submitter does not hold") from None
        return {str(k): str(v) for k, v in values.items()}

    @classmethod
    def configured(cls, keys: str | None, *, data_dir: Path) -> "Sealer":
        """The keys given (comma-separated), else the data directory's key file (made when first needed)."""
        if keys and keys.strip():
            return cls([k.strip().encode() for k in keys.split(",") if k.strip()])
        return cls(lambda: [key_file(data_dir)])


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
    """The data directory's key, made (0600, exclusively: never over another) at the first start."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = data_dir / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_key(path)
    key = Fernet.generate_key()
    try:
        os.write(fd, key + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


def read_key(path: Path) -> bytes:
    """A key file another process may be writing this instant (made, not yet written): read until it holds one."""
    for _ in range(300):
        key = path.read_bytes().strip()
        if key:
            return key
        time.sleep(0.01)
    raise ValueError(f"{path} holds no key: remove it (no job's secrets could be opened with it) or write one")
