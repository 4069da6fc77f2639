"""Builds the providers a cluster file's catalogue names, from its [providers.<name>] tables."""

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faststream.nats import NatsBroker
from pydantic import ValidationError

from services.placement.providers.base import Provider
from services.placement.providers.bootstrap import Liveness
from services.placement.providers.cloud import NodeBoot, NodeMaker, OfferInfo, offer_infos
from services.placement.providers.credentials import NodeCredentials
from services.placement.providers.local_process import LocalProcessProvider
from services.placement.providers.reconcile import Providers

if TYPE_CHECKING:  # the fleet keeps its providers: imported for its type only
    from services.placement.fleet import Fleet

KNOWN = ("local-process", "ec2", "kubernetes")
CHECKED_BY_MINTER = ("ec2", "kubernetes")  # the clouds the minter asks whether a rented node is their machine


def make_providers(
    *,
    entries: Sequence[Mapping],
    sections: Mapping[str, Any],
    default: str,
    data_dir: Path,
    broker: NatsBroker,
    nats_url: str,
    minter: Path | None,
    ca_file: Path | None,
    liveness: Liveness | None = None,
) -> Providers:
    """minter: placement's own `.creds`, with which it asks the minter for rented nodes' identities (None: they
    get none)."""
    offers = offer_infos(list(entries))
    names = {o.provider for o in offers.values()} | {default}
    unknown = sorted(names - set(KNOWN))
    if unknown:
        raise SystemExit(f"unknown provider {', '.join(unknown)} (available: {', '.join(KNOWN)})")
    local_beside_cloud(offers, sections=sections, minter=minter)
    credentials = NodeCredentials(creds=minter, nats_url=nats_url, ca_file=ca_file) if minter else None
    providers = Providers({}, offers)
    for name in sorted(names):
        if name == "local-process":
            env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMASTER_NODE_ID")}  # children: agents
            providers.by_name[name] = LocalProcessProvider(data_dir=data_dir, env=env, credentials=credentials)
            continue
        section = {"bus_url": nats_url, **(sections.get(name) or {})}
        try:
            providers.by_name[name] = _cloud(
                name,
                section,
                offers=offers,
                credentials=credentials,
                folder=data_dir / "rented",
                providers=providers,
                liveness=liveness,
            )
        except (ValidationError, ValueError) as exc:
            raise SystemExit(f"cluster file [providers.{name}]: {exc}") from None
    providers.name = "+".join(sorted(providers.by_name))
    return providers


def local_beside_cloud(offers: Mapping[str, OfferInfo], *, sections: Mapping[str, Any], minter: Path | None) -> None:
    """No start for a catalogue that rents local processes beside a cloud the minter checks: the minter then checks
    every rented node against a cloud, a local process is a machine of none, and each of its rentals would be refused
    (a failed start, a revocation spent, again for every try)."""
    checked = sorted(set(sections) & set(CHECKED_BY_MINTER))
    local = sorted(name for name, offer in offers.items() if offer.provider == "local-process")
    if minter is not None and checked and local:
        raise SystemExit(
            f"instance type {local[0]!r}: provider local-process beside [providers.{checked[0]}]: the minter checks "
            f"every rented node against {' and '.join(checked)}, where no local process is a machine; rent local "
            "processes from a cluster file without a cloud"
        )


def _cloud(
    name: str,
    section: Mapping[str, Any],
    *,
    offers: dict[str, OfferInfo],
    credentials: NodeCredentials | None,
    folder: Path,
    providers: Providers,
    liveness: Liveness | None,
) -> Provider:
    def maker(boot: NodeBoot) -> NodeMaker:
        return NodeMaker(boot=boot, folder=folder, credentials=credentials, job_of=providers.job_of, liveness=liveness)

    if name == "ec2":
        from services.placement.providers.ec2 import EC2Provider, EC2Settings

        ec2 = EC2Settings.model_validate(section)
        return EC2Provider(settings=ec2, offers=offers, maker=maker(ec2))
    from services.placement.providers.kubernetes import KubernetesProvider, KubernetesSettings

    kubernetes = KubernetesSettings.model_validate(section)
    return KubernetesProvider(settings=kubernetes, offers=offers, maker=maker(kubernetes))


def bind(providers: Providers, fleet: "Fleet") -> None:
    """Let the providers read the fleet's records: which job a node is rented for, which type it is."""
    providers.job_of = lambda node_id: getattr(fleet.nodes.get(node_id), "reserved_for", None)
    providers.instance_of = lambda node_id: getattr(fleet.nodes.get(node_id), "instance_type", None)
