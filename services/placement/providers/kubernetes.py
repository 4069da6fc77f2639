"""Kubernetes: a rented node is a Pod running the agent image with the node's GPUs as `nvidia.com/gpu` limits and
the catalogue entry's node selector; its files (its own bus credentials among them) in a Secret. Release deletes
both; reconcile finds them by label; a watch on this cluster's Pods reports a node whose Pod failed at once. The
API is spoken through lightkube (kubeconfig contexts, exec plugins, client certificates, the service account)."""

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.resources.networking_v1 import NetworkPolicy
from pydantic import Field

from shared.buscreds import NAME
from shared.cloudtags import LABEL_CLUSTER, LABEL_NODE, pod_name
from shared.kubeconfig import IN_CLUSTER, connection
from services.placement.policy import InstanceType
from services.placement.providers.base import Orphan
from services.placement.providers.bootstrap import NodeBoot, pod_manifest, secret_manifest
from services.placement.providers.cloud import NodeMaker, OfferInfo
from services.placement.providers.podwatch import failed_node

log = logging.getLogger(__name__)
ANNOTATION_JOB, LABEL_TYPE = "trainmaster.io/job", "trainmaster.io/instance-type"
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
KINDS = {"pods": Pod, "secrets": Secret}
WATCH_RETRY_S = 5.0


class KubernetesSettings(NodeBoot):
    """The cluster file's [providers.kubernetes]."""

    kubeconfig: Path | None = Field(
        None,
        description="A kubeconfig file (outside the cluster): its contexts' "
        "tokens, client certificates and exec plugins are used.",
    )
    context: str | None = Field(None, description="The kubeconfig's context (default: its current-context).")
    api_url: str | None = Field(
        None, description="The API server, without a kubeconfig (default: in the cluster, the pod's service account's)."
    )
    namespace: str = Field("trainmaster", pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    token_file: Path | None = Field(None, description="Bearer token with api_url (default: the service account's).")
    ca_file: Path | None = Field(None, description="The API server's CA with api_url (default: the service account's).")
    service_account_dir: Path = Field(IN_CLUSTER, description="Where the pod's service account is mounted.")
    image: str = Field(description="The agent image (trainmaster installed, `trainmaster-agent` on the PATH).")
    service_account: str | None = Field(None, description="The node Pods' service account (none needs API rights).")
    node_root: str = Field("/etc/trainmaster", description="Where the node's Secret is mounted in its Pod.")
    data_dir: str = Field("/var/lib/trainmaster", description="The agent's state (an emptyDir) in its Pod.")


METADATA_HOSTS = ("169.254.169.254/32", "fd00:ec2::254/128")  # EC2's (and GCE's, Azure's) metadata service


def metadata_policy(cluster: str) -> dict[str, Any]:
    """A NetworkPolicy: the cluster's node Pods may reach any address but the instance metadata service."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"tm-{cluster}-no-metadata", "labels": {LABEL_CLUSTER: cluster}},
        "spec": {
            "podSelector": {"matchLabels": {LABEL_CLUSTER: cluster}},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [METADATA_HOSTS[0]]}}]},
                {"to": [{"ipBlock": {"cidr": "::/0", "except": [METADATA_HOSTS[1]]}}]},
            ],
        },
    }


class KubernetesProvider:
    name = "kubernetes"

    def __init__(self, *, settings: KubernetesSettings, offers: dict[str, OfferInfo], maker: NodeMaker) -> None:
        self.settings = settings
        self.offers = offers
        self.maker = maker
        self.config = connection(
            kubeconfig=settings.kubeconfig,
            context=settings.context,
            api_url=settings.api_url,
            token_file=settings.token_file,
            ca_file=settings.ca_file,
            service_account=settings.service_account_dir,
        )
        self.deleting: set[str] = set()  # Pods placement deleted: their end is no failure
        self._api: AsyncClient | None = None
        self.fenced_metadata = False  # this cluster's policy keeping its Pods from the metadata service is made

    @property
    def api(self) -> AsyncClient:
        """One client (an exec plugin's token is kept between calls), made on first use, in the running loop."""
        if self._api is None:
            self._api = AsyncClient(
                config=self.config,
                namespace=self.settings.namespace,
                timeout=httpx.Timeout(15),
                trust_env=False,
                field_manager="trainmaster-placement",
            )
        return self._api

    def _labels(self, node_id: str, instance_type: str) -> dict[str, str]:
        labels = {LABEL_CLUSTER: self.settings.cluster_name, LABEL_NODE: node_id}
        if LABEL_VALUE.match(instance_type):
            labels[LABEL_TYPE] = instance_type
        return labels

    async def provision(self, node_id: str, instance: InstanceType) -> None:
        s = self.settings
        offer = self.offers.get(instance.name) or OfferInfo(name=instance.name)
        boot = await self.maker.bundle(
            node_id, instance, root=s.node_root, spot=False, data_dir=s.data_dir, consumer=False, provider=self.name
        )
        name, labels = pod_name(node_id), self._labels(node_id, instance.name)
        secret = secret_manifest(boot, name=name, labels=labels)
        pod = pod_manifest(
            boot,
            name=name,
            labels=labels,
            image=s.image,
            gpus=instance.gpus,
            cpu=instance.cpu,
            memory_gb=instance.memory_gb,
            node_selector=offer.node_selector,
            mount=s.node_root,
            data_dir=s.data_dir,
            agent_command=s.agent_command,
            service_account=s.service_account,
        )
        job = self.maker.job_of(node_id)
        if job:
            pod["metadata"]["annotations"] = {ANNOTATION_JOB: job}
        self.deleting.discard(name)
        await self._fence_metadata()
        await self._create(Secret.from_dict(secret))
        await self._create(Pod.from_dict(pod))
        await self.maker.launched(node_id, instance)  # the minter asks the API whether its Pod is
        log.info("rented %s as pod %s/%s", node_id, s.namespace, name)

    async def _fence_metadata(self) -> None:
        """This cluster's Pods may reach anything but the cloud's instance metadata (the node's role and keys: a
        task is anyone's code), by a NetworkPolicy made once (where the network plugin enforces them). One the API
        refuses (placement's Role without `networkpolicies`) is said, and renting goes on: the operator's own
        rule then keeps them (docs/providers.md)."""
        if self.fenced_metadata:
            return
        try:
            await self._create(NetworkPolicy.from_dict(metadata_policy(self.settings.cluster_name)))
            self.fenced_metadata = True
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code not in (401, 403, 404):  # the API in trouble: tried again at the next rent
                raise
            log.warning(
                "no NetworkPolicy keeps this cluster's Pods from the instance metadata (%s): keep them from it "
                "yourself, or grant placement's Role `networkpolicies` create",
                exc.response.status_code,
            )
            self.fenced_metadata = True  # refused: said once

    async def _create(self, body: Pod | Secret | NetworkPolicy) -> None:
        try:
            await self.api.create(body)
        except httpx.HTTPStatusError as exc:  # lightkube's ApiError, or a reply that is no Status
            if exc.response.status_code != 409:  # 409: made by an earlier try of this same provisioning
                raise

    async def release(self, node_id: str, handle: int | None = None) -> None:
        """Delete the Pod (its agent gets SIGTERM and reports its tasks' ends) and the Secret; then revoke."""
        name = pod_name(node_id)
        await self._delete("pods", name)
        try:
            async with asyncio.timeout(self.settings.release_wait_s):
                await self._gone(name)
        except TimeoutError:
            log.warning(
                "pod %s still terminating after %.0f s: its Secret is deleted now", name, self.settings.release_wait_s
            )
        await self._delete("secrets", name)
        await self.maker.forget(node_id)
        log.info("released %s", node_id)

    async def _gone(self, name: str) -> None:
        """Returns once the Pod is gone (terminating, its agent stops its tasks and reports their ends): a watch
        from the version last read, so its deletion is seen however soon it comes."""
        try:
            pod = await self.api.get(Pod, name)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404:
                return
            raise
        version = pod.metadata.resourceVersion if pod.metadata else None
        async for kind, event in self.api.watch(Pod, fields={"metadata.name": name}, resource_version=version):
            if kind == "DELETED" and event.metadata and event.metadata.name == name:
                return

    async def _delete(self, kind: str, name: str) -> None:
        if kind == "pods":
            self.deleting.add(name)
        try:
            await self.api.delete(KINDS[kind], name)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 404:
                raise

    async def _list(self, kind: str) -> list[dict]:
        cluster = self.settings.cluster_name
        resource: Any = KINDS[kind]  # Pod or Secret: each lists as its own model
        items = [item.to_dict() async for item in self.api.list(resource, labels={LABEL_CLUSTER: cluster})]
        # filtered here too: a namespace shared with other clusters must never lose their objects
        return [i for i in items if (i.get("metadata", {}).get("labels") or {}).get(LABEL_CLUSTER) == cluster]

    async def reconcile(self, owned: set[str]) -> list[Orphan]:
        """Delete this cluster's Pods and Secrets that no node record owns."""
        orphans = []
        for kind in ("pods", "secrets"):
            for item in await self._list(kind):
                meta = item["metadata"]
                node_id = (meta.get("labels") or {}).get(LABEL_NODE, "")
                if node_id in owned or meta.get("deletionTimestamp"):
                    continue
                await self._delete(kind, meta["name"])
                if kind == "pods":
                    orphans.append(
                        Orphan(
                            instance_id=meta["name"],
                            node_id=node_id,
                            instance_type=(meta.get("labels") or {}).get(LABEL_TYPE, ""),
                            job_id=(meta.get("annotations") or {}).get(ANNOTATION_JOB),
                            launched_at=_created(meta),
                        )
                    )
                    log.warning("deleted orphan pod %s of node %s", meta["name"], node_id)
        for orphan in orphans:
            if NAME.match(orphan.node_id):
                await self.maker.forget(orphan.node_id)
        return orphans

    async def watch(self, on_failed: Callable[[str, str], Awaitable[object]]) -> None:
        """Follow this cluster's Pods (a watch, not a poll): a Pod that failed, ended or was deleted by anyone but
        placement is its node lost, reported at once as `on_failed(node_id, reason)`. Runs until cancelled."""
        cluster = self.settings.cluster_name
        while True:
            try:
                async for kind, pod in self.api.watch(Pod, labels={LABEL_CLUSTER: cluster}):
                    verdict = failed_node(kind, pod.to_dict(), cluster=cluster, name_of=pod_name)
                    if verdict and pod_name(verdict[0]) not in self.deleting:
                        log.warning("the pod of node %s is gone: %s", *verdict)
                        await on_failed(*verdict)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API away, or the watch expired: the next one starts where it stood
                log.warning("watching the pods of %s failed: %r", cluster, exc)
            await asyncio.sleep(WATCH_RETRY_S)

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    def available(self, name: str) -> bool:
        return True


def _created(meta: dict) -> datetime:
    try:
        return datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
    except (KeyError, ValueError, AttributeError):
        return datetime.now(UTC)
