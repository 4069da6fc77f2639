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

    def launched(self, node_ids: Iterable[str] | None = None, *, stopping: bool = False) -> set[str]:
        """The node ids (among `node_ids`; any when None) whose machine is pending or running (`stopping`: or
        being stopped)."""
        ...


class EC2Instances:
    """The cluster's pending or running EC2 instances, by node id (DescribeInstances: the only call it makes)."""

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

    def launched(self, node_ids: Iterable[str] | None = None, *, stopping: bool = False) -> set[str]:
        """The node ids (among `node_ids`; any when None) that tag a pending or running instance of the cluster
        (`stopping`: or one shutting down or stopping)."""
        filters = [
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster]},
            {"Name": "instance-state-name", "Values": [*LAUNCHED, *(STOPPING if stopping else ())]},
        ]
        wanted = None if node_ids is None else sorted(set(node_ids))
        if wanted is not None and len(wanted) <= MOST_VALUES:
            filters.append({"Name": f"tag:{TAG_NODE}", "Values": wanted})
        found = set()
        for page in self.client.get_paginator("describe_instances").paginate(Filters=filters):
            for instance in (i for r in page["Reservations"] for i in r["Instances"]):
                found |= {t["Value"] for t in instance.get("Tags", []) if t["Key"] == TAG_NODE}
        return found if wanted is None else found & set(wanted)


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
