"""AWS EC2: a rented node is an instance (on-demand or spot) started with cloud-init user data that writes its
agent's own credentials and starts it; released with TerminateInstances; found again by its tags."""

import asyncio
import logging
import time

from pydantic import Field

from shared.buscreds import NAME
from shared.cloudtags import TAG_CLUSTER, TAG_JOB, TAG_NODE, TAG_TYPE
from services.placement.policy import InstanceType
from services.placement.providers.base import Orphan, Unavailable
from services.placement.providers.bootstrap import NodeBoot, user_data
from services.placement.providers.cloud import Cooldown, NodeMaker, OfferInfo

log = logging.getLogger(__name__)
ZONE_ERRORS = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacity",
        "Unsupported",
        "InsufficientCapacityOnOutpost",
    }
)  # try the next zone
TYPE_ERRORS = frozenset(
    {
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "InsufficientReservedInstanceCapacity",
    }
)  # this type, any zone
LIVE_STATES = ["pending", "running", "stopping", "stopped"]  # shutting-down: already going


class EC2Settings(NodeBoot):
    """The cluster file's [providers.ec2]."""

    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")
    endpoint_url: str | None = Field(None, description="Another EC2 endpoint (a VPC endpoint; moto in tests).")
    image_id: str | None = Field(None, description="The AMI (with Python 3.11); or a launch template.")
    launch_template: str | None = Field(None, description="Launch template name (its AMI, disks, network).")
    subnet_ids: list[str] = Field(default_factory=list, description="Tried in order when a zone has no capacity.")
    security_group_ids: list[str] = Field(default_factory=list)
    iam_instance_profile: str | None = Field(None, description="Instance profile name (none is needed).")
    key_name: str | None = None
    tags: dict[str, str] = Field(default_factory=dict, description="More tags on every instance.")
    unavailable_s: float = Field(600, ge=0, description="How long a type the cloud refused is not rented again.")
    node_root: str = "/var/lib/trainmaster"


class EC2Provider:
    name = "ec2"

    def __init__(self, *, settings: EC2Settings, offers: dict[str, OfferInfo], maker: NodeMaker) -> None:
        if not (settings.image_id or settings.launch_template):
            raise ValueError("providers.ec2: image_id or launch_template is required")
        import boto3  # lazily: only a placement that rents from EC2 needs it

        self.settings = settings
        self.offers = offers
        self.maker = maker
        self.cooldown = Cooldown(settings.unavailable_s)
        self.client = boto3.session.Session().client(
            "ec2", region_name=settings.region, endpoint_url=settings.endpoint_url
        )

    async def provision(self, node_id: str, instance: InstanceType) -> None:
        offer = self.offers.get(instance.name) or OfferInfo(name=instance.name, cloud_type=instance.name)
        spot = offer.market == "spot"
        root = f"{self.settings.node_root}/{node_id}"
        boot = await self.maker.bundle(node_id, instance, root=root, spot=spot, consumer=False, provider=self.name)
        script = user_data(
            boot,
            root=root,
            install_command=self.settings.install_command,
            agent_command=self.settings.agent_command,
        )
        request = self._request(node_id, instance.name, offer, script)
        try:
            instance_id = await asyncio.to_thread(self._run, request, offer)
        except Unavailable:
            self.cooldown.refuse(instance.name)
            await self.maker.forget(node_id)
            raise
        await self.maker.launched(node_id, instance)  # the minter asks EC2 whether it is
        log.info("rented %s as %s %s (%s)", node_id, offer.cloud_type, instance_id, offer.market)
        return None  # found again by its tag: a handle kept elsewhere could be lost with a crash

    def _request(self, node_id: str, name: str, offer: OfferInfo, script: str) -> dict:
        s = self.settings
        tags = {**s.tags, TAG_CLUSTER: s.cluster_name, TAG_NODE: node_id, TAG_TYPE: name}
        job = self.maker.job_of(node_id)
        if job:
            tags[TAG_JOB] = job
        request = {
            "InstanceType": offer.cloud_type,
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": script,
            "TagSpecifications": [
                {"ResourceType": rt, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
                for rt in ("instance", "volume")
            ],
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        if s.image_id:
            request["ImageId"] = s.image_id
        if s.launch_template:
            request["LaunchTemplate"] = {"LaunchTemplateName": s.launch_template}
        if s.security_group_ids:
            request["SecurityGroupIds"] = s.security_group_ids
        if s.iam_instance_profile:
            request["IamInstanceProfile"] = {"Name": s.iam_instance_profile}
        if s.key_name:
            request["KeyName"] = s.key_name
        if offer.market == "spot":
            request["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        return request

    def _run(self, request: dict, offer: OfferInfo) -> str:
        """RunInstances in each subnet (zone) in turn while the cloud lacks capacity there."""
        from botocore.exceptions import ClientError

        errors = []
        subnets: list[str | None] = [*self.settings.subnet_ids] or [None]
        for subnet in subnets:
            try:
                reply = self.client.run_instances(**request, **({"SubnetId": subnet} if subnet else {}))
                return reply["Instances"][0]["InstanceId"]
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if code in TYPE_ERRORS:
                    raise Unavailable(request["InstanceType"], f"{code} ({offer.market})") from exc
                if code not in ZONE_ERRORS:
                    raise
                errors.append(f"{subnet or 'default subnet'}: {code}")
                log.warning("no %s capacity in %s (%s): trying the next zone", request["InstanceType"], subnet, code)
        raise Unavailable(request["InstanceType"], "; ".join(errors))

    async def release(self, node_id: str, handle: int | None = None) -> None:
        """Terminate the node's instances (none: already gone), then revoke its credentials."""
        ids = [i["InstanceId"] for i in await asyncio.to_thread(self._instances, {TAG_NODE: node_id})]
        if ids:
            await asyncio.to_thread(self.client.terminate_instances, InstanceIds=ids)
            log.info("terminated %s (%s)", node_id, ", ".join(ids))
            deadline = time.monotonic() + self.settings.release_wait_s
            while time.monotonic() < deadline and await self._any_left(node_id):
                await asyncio.sleep(2)  # its OS is stopping the agent, which reports its tasks' ends
        await self.maker.forget(node_id)

    async def reconcile(self, owned: set[str]) -> list[Orphan]:
        """Terminate the cluster's instances that no node record owns (rented, then the record was lost)."""
        orphans = []
        for item in await asyncio.to_thread(self._instances, {}):
            tags = {t["Key"]: t["Value"] for t in item.get("Tags", [])}
            node_id = tags.get(TAG_NODE, "")
            if node_id in owned:
                continue
            orphans.append(
                Orphan(
                    instance_id=item["InstanceId"],
                    node_id=node_id,
                    instance_type=tags.get(TAG_TYPE, item.get("InstanceType", "")),
                    job_id=tags.get(TAG_JOB),
                    launched_at=item["LaunchTime"],
                )
            )
        if orphans:
            await asyncio.to_thread(self.client.terminate_instances, InstanceIds=[o.instance_id for o in orphans])
            for orphan in orphans:
                log.warning("terminated orphan instance %s of node %s", orphan.instance_id, orphan.node_id)
                if NAME.match(orphan.node_id):  # a tag is text anyone with EC2 access may write
                    await self.maker.forget(orphan.node_id)
        return orphans

    async def _any_left(self, node_id: str) -> bool:
        """Whether any instance of the node is still live or shutting down."""
        left = await asyncio.to_thread(self._instances, {TAG_NODE: node_id}, [*LIVE_STATES, "shutting-down"])
        return bool(left)

    def _instances(self, tags: dict[str, str], states: list[str] = LIVE_STATES) -> list[dict]:
        filters = [
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.settings.cluster_name]},
            {"Name": "instance-state-name", "Values": states},
        ]
        filters += [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
        found = []
        for page in self.client.get_paginator("describe_instances").paginate(Filters=filters):
            found += [i for r in page["Reservations"] for i in r["Instances"]]
        return found

    def available(self, name: str) -> bool:
        return self.cooldown.available(name, time.time())
