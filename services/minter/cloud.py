"""Whether a rented node is an instance the platform launched and that is starting or running, asked of the cloud
itself with the minter's own read-only credentials (never placement's word): EC2, by the tags placement's provider
puts on every instance it launches; Kubernetes, by its Pods' labels and names (`pods.py`)."""

from collections.abc import Iterable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, SecretStr

from shared.cloudtags import TAG_CLUSTER, TAG_NODE
from services.minter.pods import KubeCredentials, KubernetesPods, KubernetesSection

LAUNCHED = ("pending", "running")
STOPPING = ("shutting-down", "stopping")  # still carrying its agent, which reports its tasks' ends as its OS stops
# Asked under a deadline: placement waits 10 s for an answer, and botocore's defaults (60-s timeouts, retried) would
# have held the request far past it, its answer lost.
CLIENT_TIMEOUTS = {"connect_timeout": 2, "read_timeout": 3, "retries": {"max_attempts": 2, "mode": "standard"}}
MOST_VALUES = 200  # values one EC2 filter takes


class EC2Section(BaseModel):
    """What the minter reads of the cluster file's [providers.ec2]: where the instances are, which are the cluster's."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    region: str
    endpoint_url: str | None = None
    cluster_name: str = "trainmaster"


class Cloud(Protocol):
    """A provider the minter asks which of the cluster's nodes are launched (blocking: called in a thread)."""

    name: str
    machine: str  # what it launches, as its refusals name it
    where: str

    def launched(self, node_ids: Iterable[str] | None = None, *, stopping: bool = False) -> dict[str, set[str]]:
        """By node id (among `node_ids`; any when None), the ids of the machines carrying it that are pending or
        running (`stopping`: or being stopped): a node is pinned to the one that carried it first."""
        ...


class EC2Instances:
    """The cluster's pending or running EC2 instances' ids, by node id (DescribeInstances: the only call it makes)."""

    name, machine = "ec2", "instance"

    def __init__(self, section: EC2Section, *, key_id: str | None, secret: SecretStr | None) -> None:
        import boto3  # lazily: only a minter whose cluster rents from EC2 needs it
        from botocore.config import Config

        keys = {"aws_access_key_id": key_id, "aws_secret_access_key": secret.get_secret_value()} if secret else {}
        self.where = f"EC2 {section.region}, cluster {section.cluster_name}"
        self.cluster = section.cluster_name
        self.client: Any = boto3.session.Session(**keys).client(
            "ec2", region_name=section.region, endpoint_url=section.endpoint_url, config=Config(**CLIENT_TIMEOUTS)
        )

    def launched(self, node_ids: Iterable[str] | None = None, *, stopping: bool = False) -> dict[str, set[str]]:
        """By node id (among `node_ids`; any when None), the ids of the pending or running instances of the cluster
        it tags (`stopping`: or those shutting down or stopping)."""
        filters = [
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster]},
            {"Name": "instance-state-name", "Values": [*LAUNCHED, *(STOPPING if stopping else ())]},
        ]
        wanted = None if node_ids is None else sorted(set(node_ids))
        if wanted is not None and len(wanted) <= MOST_VALUES:
            filters.append({"Name": f"tag:{TAG_NODE}", "Values": wanted})
        pages = self.client.get_paginator("describe_instances").paginate(Filters=filters)
        found = instances_by_node(i for page in pages for r in page["Reservations"] for i in r["Instances"])
        return found if wanted is None else {n: ids for n, ids in found.items() if n in wanted}


def instances_by_node(instances: Iterable[dict]) -> dict[str, set[str]]:
    """By the node id each tags, the ids of the instances (DescribeInstances' answer, already filtered to the
    cluster's launched ones); one without an id is no machine to pin."""
    found: dict[str, set[str]] = {}
    for instance in instances:
        instance_id = instance.get("InstanceId")
        if not isinstance(instance_id, str) or not instance_id:
            continue
        for tag in instance.get("Tags") or []:
            if tag.get("Key") == TAG_NODE and isinstance(tag.get("Value"), str):
                found.setdefault(tag["Value"], set()).add(instance_id)
    return found


def clouds_of(
    providers: dict[str, dict[str, Any]], *, key_id: str | None, secret: SecretStr | None, kube: KubeCredentials
) -> dict[str, Cloud]:
    """The clouds to ask, by provider: each the cluster file configures that the minter can ask (EC2, Kubernetes)."""
    clouds: dict[str, Cloud] = {}
    if "ec2" in providers:
        clouds["ec2"] = EC2Instances(EC2Section.model_validate(providers["ec2"]), key_id=key_id, secret=secret)
    if "kubernetes" in providers:
        clouds["kubernetes"] = KubernetesPods(KubernetesSection.model_validate(providers["kubernetes"]), own=kube)
    return clouds
