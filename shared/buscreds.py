"""Bus identities: NATS decentralised-auth JWTs (operator, accounts, users), `.creds` files, secret files.

An operator signs two accounts: the application account (JetStream on; every trainmaster process is one of its
users) and the system account (the server's own; only used to push account updates). Users are signed by the
application account's signing key, so whoever holds that key (the stack; the minter process for rented nodes) can
mint users without being able to change the account itself.
"""

import base64
import hashlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nkeys

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # one subject token: no '.', '*', '>' or whitespace
_PREFIX = {"operator": nkeys.PREFIX_BYTE_OPERATOR, "account": nkeys.PREFIX_BYTE_ACCOUNT, "user": nkeys.PREFIX_BYTE_USER}
_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
NO_LIMITS = {"subs": -1, "data": -1, "payload": -1}
JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
ACCOUNT_LIMITS = {**NO_LIMITS, "imports": -1, "exports": -1, "wildcards": True, "conn": -1, "leaf": -1}


def new_seed(kind: str) -> str:
    """A fresh nkey seed for an operator, account or user."""
    return nkeys.encode_seed(os.urandom(32), _PREFIX[kind]).decode()


def public_key(seed: str) -> str:
    return nkeys.from_seed(seed.encode()).public_key.decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def encode_jwt(
    *,
    subject: str,
    name: str,
    signer_seed: str,
    nats: dict[str, Any],
    issued_at: int | None = None,
    expires_at: int | None = None,
) -> str:
    """A NATS JWT (v2) for `subject`, signed by `signer_seed`."""
    claims: dict[str, Any] = {
        "jti": "",
        "iat": issued_at or int(time.time()),
        "iss": public_key(signer_seed),
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
    }
    if expires_at:
        claims["exp"] = expires_at
    digest = hashlib.sha512(json.dumps(claims, sort_keys=True).encode()).digest()[:32]
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    signing_input = f"{_b64(json.dumps(_HEADER).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = nkeys.from_seed(signer_seed.encode()).sign(signing_input.encode())
    return f"{signing_input}.{_b64(signature)}"


def decode_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, unverified (for reading back what we wrote)."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


@dataclass(frozen=True)
class Permissions:
    """Subjects a user may publish to and subscribe to; everything else is refused by the server."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    inbox: str = "_INBOX"
    # may answer requests it received (once, to the reply subject each gave, whatever it is): only agents, whose
    # single requester is the submitter; services answer into the inboxes of those that may ask them (busroles)
    responses: bool = True

    def claims(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pub": {"allow": list(self.publish)},
            "sub": {"allow": [*self.subscribe, f"{self.inbox}.>"]},
            **NO_LIMITS,
        }
        if self.responses:
            out["resp"] = {"max": 1, "ttl": 0}
        return out


def mint_user(
    *,
    name: str,
    account: str,
    signer_seed: str,
    permissions: Permissions,
    seed: str | None = None,
    expires_at: int | None = None,
    issued_at: int | None = None,
) -> tuple[str, str]:
    """A user of `account` signed by `signer_seed` (the account's signing or own key): public key, `.creds`.
    seed: the user's own key when it has one already (a new one is made otherwise). expires_at: when the server
    stops taking it (never when None). issued_at: its issue time (now when None)."""
    seed = seed or new_seed("user")
    token = user_jwt(
        user=public_key(seed),
        name=name,
        account=account,
        signer_seed=signer_seed,
        permissions=permissions,
        expires_at=expires_at,
        issued_at=issued_at,
    )
    return public_key(seed), creds_text(jwt=token, seed=seed)


def user_jwt(
    *,
    user: str,
    name: str,
    account: str,
    signer_seed: str,
    permissions: Permissions,
    expires_at: int | None = None,
    issued_at: int | None = None,
) -> str:
    """The JWT of user `user` (a public key: its seed may be someone else's alone) of `account`."""
    return encode_jwt(
        subject=user,
        name=name,
        signer_seed=signer_seed,
        nats={**permissions.claims(), "issuer_account": account, "type": "user"},
        issued_at=issued_at,
        expires_at=expires_at,
    )


def account_jwt(
    *,
    name: str,
    account: str,
    operator_signer_seed: str,
    signing_keys: tuple[str, ...] = (),
    jetstream: bool = True,
    revocations: dict[str, int] | None = None,
    issued_at: int | None = None,
) -> str:
    """An account signed by the operator's signing key, with its revoked users (public key -> revoked at)."""
    nats: dict[str, Any] = {
        "limits": {**ACCOUNT_LIMITS, **(JETSTREAM if jetstream else {})},
        "signing_keys": list(signing_keys),
        "default_permissions": {"pub": {}, "sub": {}},
        "type": "account",
    }
    if revocations:
        nats["revocations"] = dict(revocations)
    return encode_jwt(subject=account, name=name, signer_seed=operator_signer_seed, nats=nats, issued_at=issued_at)


def operator_jwt(*, operator_seed: str, signer_seed: str, system_account: str) -> str:
    return encode_jwt(
        subject=public_key(operator_seed),
        name="trainmaster",
        signer_seed=operator_seed,
        nats={"signing_keys": [public_key(signer_seed)], "system_account": system_account, "type": "operator"},
    )


def creds_text(*, jwt: str, seed: str) -> str:
    """The `.creds` format nats clients read (`user_credentials=`)."""
    return (
        f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
        f"************************* IMPORTANT *************************\n"
        f"NKEY Seed printed below can be used to sign and prove identity.\n"
        f"NKEYs are sensitive and should be treated as secrets.\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )


def dedup_key(creds: Path) -> bytes:
    """A secret of this identity's own (from its user seed) that keys its JetStream message ids: a stream
    de-duplicates by id across all its subjects, so an id another publisher could predict would let it drop
    that publisher's message by sending the id first."""
    seed = re.search(rb"^SU[A-Z2-7]+$", Path(creds).read_bytes(), re.MULTILINE)
    if seed is None:
        raise ValueError(f"{creds}: no user seed in the credentials file")
    return hashlib.sha256(b"trainmaster-dedup:" + seed.group(0)).digest()


def write_secret(path: Path, text: str, *, private_folder: bool = True) -> Path:
    """Write a file only its owner can read (0600), atomically and durably: written under another name, synced,
    renamed over the old one, and the folder synced, so neither a crash nor a power loss leaves it empty or half
    written (a lost minter.json would lose its revocations). `private_folder`: the folder made 0700 too."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if private_folder:
        os.chmod(path.parent, 0o700)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return path


@dataclass
class Minter:
    """What the minter process (`services.minter`) holds to give a rented node an identity and take it back: the
    application account's signing key (users), rental signing keys (rented agents only: each dropped from the
    account with its agents' revocations once none of them is live), the operator's signing key (the account,
    re-issued with its revocations), a system account user allowed only to push that account's update to the
    server, and the public keys it minted for each node (what a node's revocation revokes). Placement holds none."""

    account: str  # the application account's public key
    account_signer_seed: str
    operator_signer_seed: str
    account_name: str
    system_creds: str
    revocations: dict[str, int] = field(default_factory=dict)
    issued_at: int = 0
    minted: dict[str, list[str]] = field(default_factory=dict)  # node id -> user public keys not yet revoked
    minted_at: dict[str, int] = field(default_factory=dict)  # node id -> when its agent identity was minted
    retired: dict[str, int] = field(default_factory=dict)  # node id -> when its identity was revoked: none again
    retired_filter: str = ""  # older retired ids, folded (base64 Bloom filter: services/minter/retired.py)
    rented_from: dict[str, str] = field(default_factory=dict)  # node id -> the provider it is checked against
    machine_of: dict[str, str] = field(default_factory=dict)  # node id -> the machine pinned at its first check
    rental_signers: list[str] = field(default_factory=list)  # signing keys of rented agents only, the newest last
    signed_by: dict[str, str] = field(default_factory=dict)  # rented agent's public key -> its rental signer's
    rekeyed: dict[str, int] = field(default_factory=dict)  # node id -> when its agent's own key was signed (once)
    confirmed: dict[str, int] = field(default_factory=dict)  # node id -> when its agent said it holds that key
    # The static identities' earlier JWTs, revoked at each start of the stack (`StaticRevocations`, a file of the
    # stack's beside the minter's): read with the minter file, carried in the account, never written back by it.
    static: "StaticRevocations" = field(default_factory=lambda: StaticRevocations())

    @property
    def latest_issued_at(self) -> int:
        """The account's issue time as the server last got it from the minter or from the stack's start: a re-issue
        must be later, or the server keeps what it has."""
        return max(self.issued_at, self.static.issued_at)

    def reissue(self, now: int) -> None:
        """The account issued anew, strictly later than any issue before."""
        self.issued_at = max(now, self.latest_issued_at + 1)

    def mint(
        self,
        *,
        name: str,
        permissions: Permissions,
        seed: str | None = None,
        expires_at: int | None = None,
        signer_seed: str | None = None,
    ) -> tuple[str, str]:
        """A user of the application account (its public key, its `.creds` text), signed by the account's signing
        key or `signer_seed` (a rental signer, which it records)."""
        seed = seed or new_seed("user")
        user = public_key(seed)
        token = self.sign(name=name, permissions=permissions, user=user, signer_seed=signer_seed, expires_at=expires_at)
        return user, creds_text(jwt=token, seed=seed)

    def sign(
        self,
        *,
        name: str,
        permissions: Permissions,
        user: str,
        signer_seed: str | None = None,
        expires_at: int | None = None,
    ) -> str:
        """The JWT of user `user` (a public key: its seed may be someone else's alone), signed by the account's
        signing key or `signer_seed` (a rental signer, which it records)."""
        token = user_jwt(
            user=user,
            name=name,
            account=self.account,
            signer_seed=signer_seed or self.account_signer_seed,
            permissions=permissions,
            expires_at=expires_at,
        )
        if signer_seed is not None:
            self.signed_by[user] = public_key(signer_seed)
        return token

    def revoke(self, *user_public_keys: str) -> str:
        """Record the revocations and drop what no longer needs carrying (`drop_unused_signers`); returns the
        account JWT to push (its issue time strictly later than the last)."""
        now = int(time.time())
        self.revocations.update(dict.fromkeys(user_public_keys, now))
        self.drop_unused_signers()
        self.reissue(now)
        return self.account_jwt()

    def drop_unused_signers(self) -> list[str]:
        """Rental signers older than the newest whose every user is revoked: dropped from the account, and with them
        their users' revocations (the server trusts no user they signed once they are gone, revoked or not); the
        signers dropped. Users signed by the account's own signing key (the stack's, older data dirs' rented nodes)
        stay revoked one by one, for ever."""
        live = {user for users in self.minted.values() for user in users}
        pinned = {self.signed_by.get(user) for user in live}
        dropped = [seed for seed in self.rental_signers[:-1] if public_key(seed) not in pinned]
        gone = {public_key(seed) for seed in dropped}
        self.rental_signers = [seed for seed in self.rental_signers if seed not in dropped]
        for user in [u for u, signer in self.signed_by.items() if signer in gone]:
            del self.signed_by[user]
            self.revocations.pop(user, None)
        return sorted(gone)

    def account_jwt(self) -> str:
        """The application account as the server must know it, revocations and rental signers included."""
        return account_jwt(
            name=self.account_name,
            account=self.account,
            operator_signer_seed=self.operator_signer_seed,
            signing_keys=(public_key(self.account_signer_seed), *map(public_key, self.rental_signers)),
            revocations={
                user: max(self.static.revoked.get(user, 0), self.revocations.get(user, 0))
                for user in {**self.static.revoked, **self.revocations}
            },
            issued_at=self.latest_issued_at or None,
        )

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in self.__dict__.items() if k != "static"}, indent=1)

    @classmethod
    def load(cls, path: Path) -> "Minter":
        """The minter file, with the stack's static revocations beside it."""
        return cls(**json.loads(path.read_text()), static=StaticRevocations.load(path.parent / STATIC_REVOCATIONS))


STATIC_REVOCATIONS = "static-revocations.json"


@dataclass
class StaticRevocations:
    """What each start of the stack (`make run`, compose's bus-keys) revokes: every JWT it or an earlier start minted
    for a static identity (a service, a static node's agent, the admin, the minter) before this start. Their users'
    keys stay from start to start (`services.stack.identities`), so without it a `.creds` file of any earlier start,
    copied off a decommissioned node or kept from a version whose permissions were wider, stayed good for ever. The
    stack writes it, the minter reads it with its own file at each use and carries it in every account it pushes;
    `issued_at` puts the account the stack starts the server with past any the minter pushed."""

    revoked: dict[str, int] = field(default_factory=dict)  # user public key -> its JWTs issued then or before revoked
    issued_at: int = 0

    @property
    def mint_from(self) -> int:
        """The earliest issue time a static identity's new JWT may have: after every revocation (a clock stepped back
        after the start would otherwise have a restarted process minted a JWT already revoked)."""
        return max(self.revoked.values(), default=-1) + 1

    @classmethod
    def load(cls, path: Path) -> "StaticRevocations":
        if not path.exists():
            return cls()
        data = json.loads(path.read_text())
        return cls(revoked={str(k): int(v) for k, v in data["revoked"].items()}, issued_at=int(data["issued_at"]))

    def to_json(self) -> str:
        return json.dumps({"revoked": self.revoked, "issued_at": self.issued_at}, indent=1)
