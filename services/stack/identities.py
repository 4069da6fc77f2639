"""`make run`'s bus identities: operator and account keys, the server's auth config, one `.creds` per process.

Everything lives under `<data dir>/bus` (0700, files 0600): `keys.json` (operator, system and application
account seeds; only this process reads it), `creds/<identity>.creds` (one per service, agent and the admin),
`minter/minter.json` (what the minter process needs to mint and revoke rented nodes' users, and its revocations;
an older data dir's `placement/minter.json` is moved there at start: placement holds no signing key any more).
"""

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from nats.errors import Error as NatsError

from shared import busroles
from shared.bus import LOG_STREAM_MAX_BYTES, make_broker, until
from shared.buscreds import (
    STATIC_REVOCATIONS,
    Minter,
    Permissions,
    StaticRevocations,
    account_jwt,
    mint_user,
    new_seed,
    operator_jwt,
    public_key,
    write_secret,
)
from shared.bustopology import declare

APP_ACCOUNT = "trainmaster"
KEYS = ("operator", "operator_signer", "system", "account", "account_signer")
CLUSTER_READY_S = 60.0


def permissions_of(identity: str) -> Permissions:
    """admin, a service's name, or agent-<node id>."""
    if identity == "admin":
        return busroles.admin()
    if identity == busroles.MINTER:
        return busroles.minter()
    if identity in busroles.SERVICES:
        return busroles.service(identity)
    if identity.startswith("agent-"):
        return busroles.agent(identity.removeprefix("agent-"))
    raise ValueError(f"unknown bus identity {identity!r}")


@dataclass
class Identities:
    root: Path  # <data dir>/bus
    # the stack runs its own NATS (configured from these keys at every start): the signing keys placement held
    # before the minter did are replaced when its file is moved; an external server keeps them (see docs)
    retire_moved_keys: bool = False

    @property
    def minter_file(self) -> Path:
        return self.root / "minter" / "minter.json"

    @property
    def placement_minter_file(self) -> Path:
        """Where placement kept the signing keys before the minter process held them (moved at start)."""
        return self.root / "placement" / "minter.json"

    def keys(self) -> dict[str, str]:
        """The operator's and accounts' seeds, made on first use and kept (a restarted server trusts the same)."""
        self.move_placement_minter()
        return self.stored_keys()

    def stored_keys(self) -> dict[str, str]:
        path = self.root / "keys.json"
        if path.exists():
            return json.loads(path.read_text())
        seeds = {name: new_seed("operator" if name.startswith("operator") else "account") for name in KEYS}
        write_secret(path, json.dumps(seeds, indent=1))
        return seeds

    def minter(self) -> Minter:
        """The minter process's keys and state, revocations included (made on first use)."""
        self.move_placement_minter()
        if not self.minter_file.exists():
            write_secret(self.minter_file, self.new_minter().to_json())
        return Minter.load(self.minter_file)

    def move_placement_minter(self) -> None:
        """Placement's old minter file, to the minter: with the users it minted for rented nodes still live (their
        `.user` files in the data dir), so that their release still revokes them, and (`retire_moved_keys`) new
        account and operator signing keys, the account re-issued newer: what placement held signs nothing any
        more. Placement's copy is deleted."""
        old = self.placement_minter_file
        if not old.exists():
            return
        if not self.minter_file.exists():
            minter = Minter.load(old)
            for node_id, user in rented_users(self.root.parent):
                if user not in minter.minted.setdefault(node_id, []):
                    minter.minted[node_id].append(user)
            if self.retire_moved_keys:
                minter.account_signer_seed, minter.operator_signer_seed = new_seed("account"), new_seed("operator")
                keys = {
                    **self.stored_keys(),
                    "account_signer": minter.account_signer_seed,
                    "operator_signer": minter.operator_signer_seed,
                }
                write_secret(self.root / "keys.json", json.dumps(keys, indent=1))
                minter.reissue(int(time.time()))
            write_secret(self.minter_file, minter.to_json())
        old.unlink()
        with contextlib.suppress(OSError):
            old.parent.rmdir()

    def revoke_earlier(self) -> None:
        """At a start of the stack, before anything is minted: every JWT of a static identity (each user key under
        `users/`: a service, an agent of a node of the cluster file or of one no longer in it, the admin, the
        minter) issued before this second's is revoked; each process is then given its `.creds` anew (`creds`),
        issued from this second on. A start in the same second as the one before leaves that one's JWTs (the
        server counts in seconds). The account the server is configured with (`server_config`) and every one the
        minter pushes carry them (`Minter.load` reads them beside its file)."""
        now = int(time.time())
        minter = self.minter()
        at = max(now - 1, minter.static.mint_from - 1)  # never earlier than a start before (a clock stepped back)
        revocations = StaticRevocations(
            revoked={public_key(f.read_text().strip()): at for f in sorted((self.root / "users").glob("*.seed"))},
            issued_at=max(now, minter.latest_issued_at + 1),
        )
        write_secret(self.minter_file.parent / STATIC_REVOCATIONS, revocations.to_json())

    def new_minter(self) -> Minter:
        keys = self.stored_keys()
        _, updater = mint_user(
            name="account-updater",
            account=public_key(keys["system"]),
            signer_seed=keys["system"],
            permissions=busroles.account_updater(public_key(keys["account"])),
        )
        return Minter(
            account=public_key(keys["account"]),
            account_signer_seed=keys["account_signer"],
            operator_signer_seed=keys["operator_signer"],
            account_name=APP_ACCOUNT,
            system_creds=updater,
        )

    def creds(self, identity: str) -> Path:
        """A fresh `.creds` file for one process (re-minted at every start, so it carries today's permissions;
        its user key stays, so the process keeps the message ids it had: see `buscreds.dedup_key`)."""
        seed_file = self.root / "users" / f"{identity}.seed"
        if not seed_file.exists():
            write_secret(seed_file, new_seed("user"))
        keys = self.keys()
        static = StaticRevocations.load(self.minter_file.parent / STATIC_REVOCATIONS)
        _, text = mint_user(
            name=identity,
            account=public_key(keys["account"]),
            signer_seed=keys["account_signer"],
            permissions=permissions_of(identity),
            seed=seed_file.read_text().strip(),
            issued_at=max(int(time.time()), static.mint_from),
        )
        return write_secret(self.root / "creds" / f"{identity}.creds", text)

    def server_config(self, *, resolver_dir: Path) -> str:
        """The `nats-server` configuration block for decentralised auth; anonymous clients are refused."""
        keys = self.keys()
        system = public_key(keys["system"])
        accounts = {
            system: account_jwt(
                name="SYS", account=system, operator_signer_seed=keys["operator_signer"], jetstream=False
            ),
            public_key(keys["account"]): self.minter().account_jwt(),
        }
        preload = "".join(f'  {key}: "{token}"\n' for key, token in accounts.items())
        operator = operator_jwt(
            operator_seed=keys["operator"], signer_seed=keys["operator_signer"], system_account=system
        )
        return (
            f'operator: "{operator}"\nsystem_account: "{system}"\n'
            f'resolver: {{\n  type: full\n  dir: "{resolver_dir}"\n  allow_delete: false\n  interval: "2m"\n}}\n'
            f"resolver_preload: {{\n{preload}}}\n"
        )


def rented_users(data_dir: Path) -> list[tuple[str, str]]:
    """(node id, user public key) of each rented node whose identity placement minted and has not revoked yet (the
    `.user` files of the local-process and the cloud providers)."""
    files = [f for folder in ("provisioned", "rented") for f in sorted((data_dir / folder).glob("*.user"))]
    return [(f.stem, f.read_text().strip()) for f in files]


async def prepare_bus(
    url: str,
    *,
    creds: Path,
    node_ids: list[str],
    ca_file: Path | None = None,
    replicas: int = 1,
    log_max_bytes: int = LOG_STREAM_MAX_BYTES,
    shrink: bool = False,
    prune: bool = False,
    ready_s: float = CLUSTER_READY_S,
) -> None:
    """As the admin: declare the bus (`shared.bustopology.declare`): every stream (`replicas` copies each), every
    service's consumer and each node's command consumer; no service or agent may make or change any of them
    (`prune`: every consumer it does not declare is deleted, not only those some identity could misuse). A
    cluster just started has no JetStream leader for a few seconds: declaring is retried until then, `ready_s` in
    all (each try is given what is left of it)."""
    deadline = time.monotonic() + ready_s
    while True:
        broker = make_broker(url, name="stack", creds=creds, ca_file=ca_file)
        try:
            await declare(
                broker,
                node_ids=node_ids,
                replicas=replicas,
                log_max_bytes=log_max_bytes,
                shrink=shrink,
                prune=prune,
                patience_s=until(deadline),
            )
            return
        except (NatsError, TimeoutError, ConnectionError) as exc:
            if not until(deadline):
                raise RuntimeError(
                    f"JetStream would not take the bus's declaration within {ready_s:g} s: {exc!r}"
                ) from exc
            await asyncio.sleep(0.5)
        finally:
            await broker.stop()


def main() -> None:
    """For an operator running NATS and the processes apart (docker compose): write the server's auth block and
    every identity's `.creds` (`write`), then, once the server is up and before any service or agent starts,
    declare the bus: its streams and every consumer (`prepare`, at every deploy: it brings them to this version).
    The stream settings default to the stack's (TRAINMASTER_STREAM_REPLICAS, TRAINMASTER_LOG_STREAM_MAX_BYTES)."""
    from services.agent.resources import agent_node_ids
    from services.stack.settings import StackSettings

    settings = StackSettings()
    parser = argparse.ArgumentParser(prog="python -m services.stack.identities", description=main.__doc__)
    parser.add_argument("action", choices=("write", "prepare"))
    parser.add_argument("--dir", type=Path, help="where keys and .creds live (kept secret); write only")
    parser.add_argument("--creds", type=Path, help="prepare: the admin's .creds (default: <dir>/creds/admin/)")
    parser.add_argument("--admin-uid", type=int, help="write: the user that owns the admin's .creds (bus-prepare's)")
    parser.add_argument("--cluster-file", type=Path, default=settings.cluster_file, help="the static nodes")
    parser.add_argument("--nats-url", default=settings.nats_url or "nats://nats:4222")
    parser.add_argument("--ca-file", type=Path, default=settings.nats_ca_file, help="CA of the servers' certificate")
    parser.add_argument(
        "--replicas", type=int, default=settings.stream_replicas or 1, choices=range(1, 6), help="copies of each stream"
    )
    parser.add_argument(
        "--log-max-bytes", type=int, default=settings.log_stream_max_bytes, help="output TM_LOGS keeps at most"
    )
    parser.add_argument("--shrink", action="store_true", help="prepare: a stream may keep less or fewer copies")
    parser.add_argument(
        "--prune",
        action="store_true",
        default=settings.bus_prune,
        help="prepare: delete every consumer the platform does not declare (a newer version's, an operator's)",
    )
    parser.add_argument("--resolver-dir", default="/data/accounts", help="where the server keeps account JWTs")
    parser.add_argument(
        "--retire-placement-keys",
        action="store_true",
        help="write: replace the signing keys an older version gave placement (placement/minter.json) when moving "
        "them to the minter; then restart every NATS server (it must load the new auth.conf before any process)",
    )
    parser.add_argument(
        "--revoke-earlier",
        action="store_true",
        help="write: revoke every .creds an earlier write made (a node taken out of the cluster file, a leaked file); "
        "then recreate every container that holds one and restart the minter (docker compose up -d --force-recreate)",
    )
    parser.add_argument(
        "--routes",
        help="write: the cluster's route addresses (host:port, comma-separated): server/routes.conf, the servers' "
        "cluster block with a route password made once (deploy/nats.conf includes it)",
    )
    args = parser.parse_args()
    node_ids = agent_node_ids(args.cluster_file)
    if args.action == "prepare":
        if args.creds is None and args.dir is None:
            parser.error("prepare needs --creds (or --dir)")
        creds = args.creds or args.dir / "creds" / "admin" / "nats.creds"
        prepare = prepare_bus(
            args.nats_url,
            creds=creds,
            node_ids=node_ids,
            ca_file=args.ca_file,
            replicas=args.replicas,
            log_max_bytes=args.log_max_bytes,
            shrink=args.shrink,
            prune=args.prune,
        )
        asyncio.run(prepare)
        return
    if args.dir is None:
        parser.error("write needs --dir")
    identities = Identities(args.dir, retire_moved_keys=args.retire_placement_keys)
    write(
        identities,
        node_ids=node_ids,
        resolver_dir=Path(args.resolver_dir),
        admin_uid=args.admin_uid,
        revoke_earlier=args.revoke_earlier,
        routes=[r for r in (args.routes or "").split(",") if r],
    )


def write(
    identities: Identities,
    *,
    node_ids: list[str],
    resolver_dir: Path,
    admin_uid: int | None,
    revoke_earlier: bool = False,
    routes: list[str] | None = None,
) -> None:
    """Every identity's `.creds`, one folder each (what its container mounts), and the server's auth block;
    `revoke_earlier`: the `.creds` of every earlier `write` revoked first (`Identities.revoke_earlier`: every
    container holding one must be recreated, its connection is closed for good once the servers know)."""
    if revoke_earlier:
        identities.revoke_earlier()
    for identity in ("admin", busroles.MINTER, *busroles.SERVICES, *(f"agent-{node_id}" for node_id in node_ids)):
        path = identities.creds(identity)
        folder = path.parent / identity
        folder.mkdir(mode=0o700, exist_ok=True)  # one folder per container to mount
        path.replace(folder / "nats.creds")
        if identity == "admin" and admin_uid is not None:  # bus-prepare runs as that user, not as root
            for owned in (folder, folder / "nats.creds"):
                os.chown(owned, admin_uid, admin_uid)
    identities.minter()
    auth = identities.root / "server" / "auth.conf"  # the only folder the server's container mounts
    auth.parent.mkdir(mode=0o755, exist_ok=True)
    auth.write_text(identities.server_config(resolver_dir=resolver_dir))
    auth.chmod(0o644)  # public JWTs only
    if routes:
        write_routes(identities.root, routes)


def route_secret(root: Path) -> str:
    """The password the cluster's servers route to each other with: made once, kept beside the keys (0600)."""
    path = root / "route.secret"
    try:
        if kept := path.read_text().strip():
            return kept
    except FileNotFoundError:
        pass
    secret = secrets.token_hex(24)
    write_secret(path, secret)  # whole or not at all: an empty one would be a password ""
    return secret


def routes_config(secret: str, routes: list[str], *, listen: str = "0.0.0.0:6222") -> str:
    """The servers' cluster block: a route carries every account's messages, checked against no user's
    permissions, so only a server that knows the secret routes in (an open route port let anything on the network
    join the cluster and publish as the platform; found by review)."""
    urls = ", ".join(f'"nats-route://route:{secret}@{route}"' for route in routes)
    return (
        f'cluster {{\n  name: "trainmaster"\n  listen: "{listen}"\n'
        f'  authorization {{\n    user: "route"\n    password: "{secret}"\n    timeout: 2\n  }}\n'
        f"  routes: [{urls}]\n}}\n"
    )


def write_routes(root: Path, routes: list[str]) -> Path:
    """`routes.conf` in the servers' folder (0600: it holds the secret), what `deploy/nats.conf` includes."""
    for route in routes:
        if not re.fullmatch(r"[A-Za-z0-9.-]{1,253}:[0-9]{1,5}", route):
            raise SystemExit(f"--routes: {route!r} is not host:port")
    config = routes_config(route_secret(root), routes)
    return write_secret(root / "server" / "routes.conf", config, private_folder=False)


if __name__ == "__main__":
    main()
