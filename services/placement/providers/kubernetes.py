"""Kubernetes: a rented node is a Pod running the agent image with the node's GPUs as `nvidia.com/gpu` limits and
the catalogue entry's node selector; its files (its own bus credentials among them) in a Secret. Release deletes
both; reconcile finds them by label. Plain REST over httpx: four calls need no client library."""
import asyncio
import logging
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from pydantic import Field

from shared.buscreds import NAME
from services.placement.policy import InstanceType
from services.placement.providers.base import Orphan
from services.placement.providers.bootstrap import NodeBoot, pod_manifest, secret_manifest
from services.placement.providers.cloud import NodeMaker, OfferInfo

log = logging.getLogger(__name__)
IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")
LABEL_CLUSTER, LABEL_NODE, ANNOTATION_JOB, LABEL_TYPE = ("trainmaster.io/cluster", "trainmaster.io/node-id",
                                                         "trainmaster.io/job", "trainmaster.io/instance-type")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


class KubernetesSettings(NodeBoot):
    """The cluster file's [providers.kubernetes]."""

    api_url: str = Field("https://kubernetes.default.svc", description="The API server.")
    namespace: str = Field("trainmaster", pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    token_file: Path | None = Field(None, description="Bearer token (default: the pod's service account's).")
    ca_file: Path | None = Field(None, description="The API server's CA (default: the service account's).")
    image: str = Field(description="The agent image (trainmaster installed, `trainmaster-agent` on the PATH).")
    service_account: str | None = Field(None, description="The node Pods' service account (none needs API rights).")
    node_root: str = Field("/etc/trainmaster", description="Where the node's Secret is mounted in its Pod.")
    data_dir: str = Field("/var/lib/trainmaster", description="The agent's state (an emptyDir) in its Pod.")


def pod_name(node_id: str) -> str:
    return f"tm-{node_id.lower().replace('_', '-')}"[:63].rstrip("-")


class KubernetesProvider:
    name = "kubernetes"

    def __init__(self, *, settings: KubernetesSettings, offers: dict[str, OfferInfo], maker: NodeMaker) -> None:
        self.settings = settings
        self.offers = offers
        self.maker = maker
        token_file = settings.token_file or (IN_CLUSTER / "token" if (IN_CLUSTER / "token").exists() else None)
        ca_file = settings.ca_file or (IN_CLUSTER / "ca.crt" if (IN_CLUSTER / "ca.crt").exists() else None)
        self.token_file = token_file
        self.verify = str(ca_file) if ca_file else True
        self.base = f"/api/v1/namespaces/{settings.namespace}"

    def _client(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.token_file.read_text().strip()}"} if self.token_file else {}
        return httpx.AsyncClient(base_url=self.settings.api_url, headers=headers, verify=self.verify, timeout=15,
                                 trust_env=False)

    def _labels(self, node_id: str, instance_type: str) -> dict[str, str]:
        labels = {LABEL_CLUSTER: self.settings.cluster_name, LABEL_NODE: node_id}
        if LABEL_VALUE.match(instance_type):
            labels[LABEL_TYPE] = instance_type
        return labels

    async def provision(self, node_id: str, instance: InstanceType) -> None:
        s = self.settings
        offer = self.offers.get(instance.name) or OfferInfo(name=instance.name)
        boot = await self.maker.bundle(node_id, instance, root=s.node_root, spot=False, data_dir=s.data_dir)
        name, labels = pod_name(node_id), self._labels(node_id, instance.name)
        secret = secret_manifest(boot, name=name, labels=labels)
        pod = pod_manifest(boot, name=name, labels=labels, image=s.image, gpus=instance.gpus, cpu=instance.cpu,
                           memory_gb=instance.memory_gb, node_selector=offer.node_selector, mount=s.node_root,
                           data_dir=s.data_dir,
                           agent_command=s.agent_command, service_account=s.service_account)
        job = self.maker.job_of(node_id)
        if job:
            pod["metadata"]["annotations"] = {ANNOTATION_JOB: job}
        async with self._client() as client:
            await self._create(client, "secrets", secret)
            await self._create(client, "pods", pod)
        log.info("rented %s as pod %s/%s", node_id, s.namespace, name)

    async def _create(self, client: httpx.AsyncClient, kind: str, body: dict) -> None:
        reply = await client.post(f"{self.base}/{kind}", json=body)
        if reply.status_code == 409:  # made by an earlier try of this same provisioning
            return
        reply.raise_for_status()

    async def release(self, node_id: str, handle: int | None = None) -> None:
        """Delete the Pod (its agent gets SIGTERM and reports its tasks' ends) and the Secret; then revoke."""
        name = pod_name(node_id)
        async with self._client() as client:
            await self._delete(client, "pods", name)
            deadline = time.monotonic() + self.settings.release_wait_s
            while time.monotonic() < deadline and (await client.get(f"{self.base}/pods/{name}")).status_code != 404:
                await asyncio.sleep(2)  # terminating: its agent is stopping its tasks and reporting their ends
            await self._delete(client, "secrets", name)
        await self.maker.forget(node_id)
        log.info("released %s", node_id)

    async def _delete(self, client: httpx.AsyncClient, kind: str, name: str) -> None:
        reply = await client.delete(f"{self.base}/{kind}/{name}")
        if reply.status_code != 404:
            reply.raise_for_status()

    async def _list(self, client: httpx.AsyncClient, kind: str) -> list[dict]:
        selector = f"{LABEL_CLUSTER}={self.settings.cluster_name}"
        reply = await client.get(f"{self.base}/{kind}", params={"labelSelector": selector})
        reply.raise_for_status()
        items = reply.json().get("items", [])
        # filtered here too: a namespace shared with other clusters must never lose their objects
        return [i for i in items if i.get("metadata", {}).get("labels", {}).get(LABEL_CLUSTER)
                == self.settings.cluster_name]

    async def reconcile(self, owned: set[str]) -> list[Orphan]:
        """Delete this cluster's Pods and Secrets that no node record owns."""
        orphans = []
        async with self._client() as client:
            for kind in ("pods", "secrets"):
                for item in await self._list(client, kind):
                    meta = item["metadata"]
                    node_id = meta.get("labels", {}).get(LABEL_NODE, "")
                    if node_id in owned or meta.get("deletionTimestamp"):
                        continue
                    await self._delete(client, kind, meta["name"])
                    if kind == "pods":
                        orphans.append(Orphan(instance_id=meta["name"], node_id=node_id,
                                              instance_type=meta.get("labels", {}).get(LABEL_TYPE, ""),
                                              job_id=(meta.get("annotations") or {}).get(ANNOTATION_JOB),
                                              launched_at=_created(meta)))
                        log.warning("deleted orphan pod %s of node %s", meta["name"], node_id)
        for orphan in orphans:
            if NAME.match(orphan.node_id):
                await self.maker.forget(orphan.node_id)
        return orphans

    def available(self, name: str) -> bool:
        return True


def _created(meta: dict) -> datetime:
    try:
        return datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
    except (KeyError, ValueError, AttributeError):
        return datetime.now(UTC)
