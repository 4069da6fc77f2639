"""Whether a rented node is a Pod the platform created and that is pending or running, asked of the Kubernetes API
itself with the minter's own read-only credentials (never placement's, never placement's word): by the labels and
the name placement's Kubernetes provider gives every node's Pod."""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from shared.buscreds import NAME
from shared.cloudtags import LABEL_CLUSTER, LABEL_NODE, pod_name
from shared.kubeconfig import IN_CLUSTER, connection

LAUNCHED = ("Pending", "Running")  # the API server sets Pending at creation; Succeeded/Failed never come back


class KubernetesSection(BaseModel):
    """What the minter reads of the cluster file's [providers.kubernetes]: where the Pods are, which are the
    cluster's, and where the API is (never placement's credentials: its kubeconfig and token file are not read)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    namespace: str = "trainmaster"
    cluster_name: str = "trainmaster"
    api_url: str | None = None
    ca_file: Path | None = None


class KubeCredentials(BaseModel):
    """The minter's own way to the API (a Role with get and list on pods only)."""

    model_config = ConfigDict(frozen=True)

    kubeconfig: Path | None = None
    context: str | None = None
    api_url: str | None = None
    token_file: Path | None = None
    ca_file: Path | None = None
    service_account_dir: Path = IN_CLUSTER


def launched_pods(pods: Iterable[dict], *, cluster: str, stopping: bool = False) -> dict[str, set[str]]:
    """By node id, the uids of its own Pods (this cluster's label and the name placement gives that node's Pod:
    anyone who may create Pods may label one with another node's id) that are pending or running and not being
    deleted (`stopping`: or being deleted, its agent still reporting its tasks' ends). The uid tells a Pod from a
    later one under the same name (a real API server sets it on every Pod; one without is no machine to pin)."""
    found: dict[str, set[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        node_id, uid = labels.get(LABEL_NODE), meta.get("uid")
        if labels.get(LABEL_CLUSTER) != cluster or not isinstance(node_id, str) or not NAME.match(node_id):
            continue
        if meta.get("name") != pod_name(node_id) or (meta.get("deletionTimestamp") and not stopping):
            continue
        if not isinstance(uid, str) or not uid:
            continue
        if (pod.get("status") or {}).get("phase") in LAUNCHED:
            found.setdefault(node_id, set()).add(uid)
    return found


class KubernetesPods:
    """The cluster's pending or running node Pods' uids, by node id (a list of Pods by label: the only call it
    makes)."""

    name, machine = "kubernetes", "Pod"

    def __init__(self, section: KubernetesSection, *, own: KubeCredentials) -> None:
        import httpx  # lazily, as lightkube beneath shared.kubeconfig: only a minter renting Pods needs them
        from lightkube import Client

        try:
            config = connection(
                kubeconfig=own.kubeconfig,
                context=own.context,
                api_url=own.api_url or section.api_url,
                token_file=own.token_file,
                ca_file=own.ca_file or section.ca_file,
                service_account=own.service_account_dir,
            )
        except ValueError as exc:
            raise ValueError(
                f"the minter's own Kubernetes credentials (TRAINMASTER_K8S_KUBECONFIG and _CONTEXT, or "
                f"TRAINMASTER_K8S_API_URL with _TOKEN_FILE and _CA_FILE, or its pod's service account): {exc}"
            ) from None
        self.where = f"Kubernetes namespace {section.namespace}, cluster {section.cluster_name}"
        self.cluster = section.cluster_name
        self.client: Any = Client(config=config, namespace=section.namespace, timeout=httpx.Timeout(4), trust_env=False)

    def launched(self, node_ids: Iterable[str] | None = None, *, stopping: bool = False) -> dict[str, set[str]]:
        """By node id (among `node_ids`; any when None), the uids of its Pods of the cluster that are pending or
        running (`stopping`: or being deleted)."""
        from lightkube.resources.core_v1 import Pod

        wanted = None if node_ids is None else set(node_ids)
        labels = {LABEL_CLUSTER: self.cluster}
        if wanted is not None and len(wanted) == 1:
            labels[LABEL_NODE] = next(iter(wanted))
        pods = (pod.to_dict() for pod in self.client.list(Pod, labels=labels))
        found = launched_pods(pods, cluster=self.cluster, stopping=stopping)
        return found if wanted is None else {n: uids for n, uids in found.items() if n in wanted}
