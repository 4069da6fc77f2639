"""The EC2 provider against moto's EC2 served on 127.0.0.1 (real boto3 calls over HTTP). The test acts as the
cloud: for each instance moto reports, it runs the instance's user data (the cloud-init script) as a local machine,
and halts the machine when the instance is terminated."""

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytest_asyncio

from services.placement.adapter import catalogue_from
from services.placement.providers import Unavailable
from services.placement.providers.cloud import NodeMaker, offer_infos
from tests.conftest import ADMIN_TOKEN, admin_client, start_stack, stop_later
from tests.e2e.helpers import get, logs_containing, submit, wait_phase
from tests.e2e.scripts import counter
from tests.integration.clouds import FAKE_AWS, Machines, Metadata, agent_command, loopback_only, poll

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

IMDS = "http://169.254.169.254"  # the address a real node reads; this cloud routes it to the machine's own


@pytest.fixture(scope="module")
def aws():
    saved = {k: os.environ.get(k) for k in FAKE_AWS}
    os.environ.update(FAKE_AWS)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    url = loopback_only(f"http://127.0.0.1:{server.get_host_and_port()[1]}")
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.7.{i}.0/24", AvailabilityZone=f"us-east-1{z}")["Subnet"]["SubnetId"]
        for i, z in enumerate("ab")
    ]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    yield SimpleNamespace(url=url, ec2=ec2, subnets=subnets, image=image)
    server.stop()
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def entry(name: str = "g.small", *, market: str = "on_demand", price: float = 2.0) -> dict:
    return {
        "name": name,
        "gpus": 1,
        "gpu_model": "A10G",
        "gpu_memory_gb": 24,
        "tflops": 125,
        "cpu": 4,
        "memory_gb": 16,
        "price_per_hour": price,
        "startup_delay_s": 0,
        "provider": "ec2",
        "market": market,
        "cloud_type": "g5.xlarge",
    }


def provider(aws, tmp_path: Path, *entries: dict, cluster: str | None = None):
    from services.placement.providers.ec2 import EC2Provider, EC2Settings

    settings = EC2Settings(
        region="us-east-1",
        endpoint_url=aws.url,
        image_id=aws.image,
        subnet_ids=aws.subnets,
        cluster_name=cluster or f"c{uuid.uuid4().hex[:8]}",
        bus_url="nats://10.0.0.1:4222",
    )
    entries = entries or (entry(),)
    return EC2Provider(
        settings=settings, offers=offer_infos(list(entries)), maker=NodeMaker(boot=settings, folder=tmp_path)
    ), catalogue_from(entries)


def instances(aws, cluster: str) -> list[dict]:
    pages = aws.ec2.describe_instances(Filters=[{"Name": "tag:trainmaster:cluster", "Values": [cluster]}])
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def refuse_in(client, code: str, subnets: set[str] | None = None) -> list[str]:
    """The cloud answers RunInstances with `code` (in these subnets, or anywhere): a hook at boto3's event level,
    since moto never runs out of capacity. Returns the subnets asked, in order."""
    from botocore.awsrequest import AWSResponse

    asked = []

    def refuse(params, **_):
        subnet = params["body"].get("SubnetId")
        asked.append(subnet)
        if subnets is None or subnet in subnets:
            return AWSResponse("", 400, {}, None), {
                "Error": {"Code": code, "Message": f"no {code} here"},
                "ResponseMetadata": {"HTTPStatusCode": 400},
            }
        return None

    client.meta.events.register("before-call.ec2.RunInstances", refuse)
    return asked


async def test_an_instance_carries_its_tags_its_market_and_its_node(aws, tmp_path):
    ec2, catalogue = provider(aws, tmp_path, entry(), entry("g.small.spot", market="spot", price=0.8))
    cluster = ec2.settings.cluster_name
    ec2.maker.job_of = lambda node_id: "job-1"
    await ec2.provision("od-a", catalogue[0])
    await ec2.provision("od-b", catalogue[1])
    found = {
        next(t["Value"] for t in i["Tags"] if t["Key"] == "trainmaster:node-id"): i for i in instances(aws, cluster)
    }
    assert set(found) == {"od-a", "od-b"}
    a, b = found["od-a"], found["od-b"]
    assert a["InstanceType"] == "g5.xlarge" and a.get("InstanceLifecycle") != "spot"
    assert b.get("InstanceLifecycle") == "spot"
    assert {"Key": "trainmaster:job", "Value": "job-1"} in a["Tags"]
    script = base64.b64decode(
        aws.ec2.describe_instance_attribute(InstanceId=a["InstanceId"], Attribute="userData")["UserData"]["Value"]
    ).decode()
    assert script.startswith("#!/bin/bash") and 'id = "od-a"' in script
    assert "export TRAINMASTER_NATS_URL=nats://10.0.0.1:4222" in script
    assert "TRAINMASTER_SPOT_METADATA_URL" not in script  # on-demand: nothing to watch
    await ec2.release("od-a", None)
    assert [i["State"]["Name"] for i in instances(aws, cluster) if i["InstanceId"] == a["InstanceId"]] in (
        ["shutting-down"],
        ["terminated"],
    )
    await ec2.release("od-a", None)  # again: nothing left, no error


async def test_a_zone_without_capacity_moves_the_node_to_the_next(aws, tmp_path):
    ec2, catalogue = provider(aws, tmp_path)
    asked = refuse_in(ec2.client, "InsufficientInstanceCapacity", {aws.subnets[0]})
    await ec2.provision("od-z", catalogue[0])
    assert asked == aws.subnets
    [made] = instances(aws, ec2.settings.cluster_name)
    assert made["SubnetId"] == aws.subnets[1]


@pytest.mark.parametrize(
    "code, tries", [("InsufficientInstanceCapacity", 2), ("VcpuLimitExceeded", 1), ("MaxSpotInstanceCountExceeded", 1)]
)
async def test_a_type_the_cloud_cannot_give_rests_and_nothing_is_left(aws, tmp_path, code, tries):
    ec2, catalogue = provider(aws, tmp_path)
    asked = refuse_in(ec2.client, code)
    with pytest.raises(Unavailable, match=code):
        await ec2.provision("od-u", catalogue[0])
    assert len(asked) == tries  # a quota is the type's everywhere: no zone is tried after it
    assert not ec2.available("g.small")  # placement hides it for a while and rents the next type
    assert instances(aws, ec2.settings.cluster_name) == []


async def test_reconcile_terminates_what_no_record_owns_and_only_that(aws, tmp_path):
    ec2, catalogue = provider(aws, tmp_path)
    await ec2.provision("od-kept", catalogue[0])
    await ec2.provision("od-crashed", catalogue[0])  # rented, then placement died before recording it
    other, _ = provider(aws, tmp_path)  # another cluster's instance in the same account
    await other.provision("od-theirs", catalogue[0])
    orphans = await ec2.reconcile({"od-kept"})
    assert [(o.node_id, o.instance_type) for o in orphans] == [("od-crashed", "g.small")]
    states = {
        next(t["Value"] for t in i["Tags"] if t["Key"] == "trainmaster:node-id"): i["State"]["Name"]
        for c in (ec2, other)
        for i in instances(aws, c.settings.cluster_name)
    }
    assert states["od-kept"] in ("pending", "running") and states["od-theirs"] in ("pending", "running")
    assert states["od-crashed"] in ("shutting-down", "terminated")
    assert await ec2.reconcile({"od-kept"}) == []


# --- The whole stack renting from this EC2 ------------------------------------------------------------------------
FLEET = """
[[instance_types]]
name = "g.small.spot"
provider = "ec2"
market = "spot"
cloud_type = "g5.xlarge"
gpus = 1
gpu_model = "A10G"
gpu_memory_gb = 24
tflops = 125
cpu = 4
memory_gb = 16
price_per_hour = 0.4
startup_delay_s = 1

[providers.ec2]
region = "us-east-1"
endpoint_url = "{url}"
image_id = "{image}"
subnet_ids = {subnets}
cluster_name = "{cluster}"
agent_command = "{agent}"
node_root = "{machines}"

[providers.ec2.agent_env]
TRAINMASTER_USE_NVML = "false"
TRAINMASTER_HEARTBEAT_INTERVAL_S = "0.5"
TRAINMASTER_CHECKPOINT_SYNC_S = "0.5"
TRAINMASTER_SPOT_POLL_S = "0.3"
TRAINMASTER_CHECKPOINT_URL = "file://{data}/checkpoints"
TRAINMASTER_STORAGE_URL = "file://{data}/storage"
"""
TUNING = {"TRAINMASTER_IDLE_RELEASE_S": "2", "TRAINMASTER_SCHEDULE_TICK_S": "1", "TRAINMASTER_RECONCILE_S": "1"}


class Cloud:
    """Boots a machine for each instance of the cluster (its user data, IMDS routed to its own metadata), halts
    it when the instance is terminated."""

    def __init__(self, aws, cluster: str, machines: Machines, metadata: Metadata) -> None:
        self.aws, self.cluster, self.machines, self.metadata = aws, cluster, machines, metadata
        self.booted: dict[str, str] = {}  # instance -> node id
        self.scripts: dict[str, str] = {}

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.step)
            await asyncio.sleep(0.3)

    def step(self) -> None:
        for item in instances(self.aws, self.cluster):
            instance, state = item["InstanceId"], item["State"]["Name"]
            if state in ("pending", "running") and instance not in self.booted:
                data = self.aws.ec2.describe_instance_attribute(InstanceId=instance, Attribute="userData")
                self.booted[instance] = next(t["Value"] for t in item["Tags"] if t["Key"] == "trainmaster:node-id")
                if "Value" not in data["UserData"]:
                    # Launched without user data (not by the provider: the orphan a test rents itself), so there is
                    # no script to run. Reading it as a script raised, which ended `run` unseen: no machine was
                    # halted after that, and the module's end waited out the stop timeout of revoked agents.
                    continue
                script = base64.b64decode(data["UserData"]["Value"]).decode()
                self.scripts[instance] = script
                script = script.replace(IMDS, f"{self.metadata.url}/{instance}")
                path = self.machines.root / f"{instance}.sh"
                self.machines.root.mkdir(parents=True, exist_ok=True)
                path.write_text(script)
                self.machines.boot(instance, ["bash", str(path)])
            elif state in ("shutting-down", "terminated") and instance in self.machines.running:
                self.machines.halt_later(instance)

    def instance_of(self, node_id: str) -> str:
        return next(i for i, n in self.booted.items() if n == node_id)


class Rented(Machines):
    """`Machines` that remember the machines they halt in the background, so the module's end can kill them."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.stopping: list[subprocess.Popen] = []

    def halt_later(self, key: str, *, timeout_s: float = 15) -> None:
        if (process := self.running.get(key)) is not None:
            self.stopping.append(process)
        super().halt_later(key, timeout_s=timeout_s)

    def kill_all(self) -> None:
        """Every machine's process group SIGKILLed at once, then reaped. An agent whose identity was revoked with
        its release spends its whole stop timeout (15 s) on a report the server refuses; the module's end reads no
        report, and no task runs on a machine by then (each test waits for its job's end)."""
        for process in [*self.running.values(), *self.stopping]:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        self.halt_all()  # reaps them: the halts in the background end as soon as their machine is gone


@pytest.fixture(scope="module")
def ec2_stack(aws, tmp_path_factory, servers):
    data = tmp_path_factory.mktemp("ec2")
    cluster = f"it-{uuid.uuid4().hex[:8]}"
    fleet = FLEET.format(
        url=aws.url,
        image=aws.image,
        subnets=json.dumps(aws.subnets),
        cluster=cluster,
        agent=agent_command(),
        machines=data / "machines",
        data=data,
    )
    stack = start_stack(data, cluster=fleet, servers=servers, extra_env={**TUNING, **FAKE_AWS})
    yield SimpleNamespace(stack=stack, cluster=cluster, machines=Rented(data / "machines"), data=data)
    stop_later(stack)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cloud(aws, ec2_stack):
    metadata = Metadata()
    cloud = Cloud(aws, ec2_stack.cluster, ec2_stack.machines, metadata)
    task = asyncio.create_task(cloud.run())
    yield cloud
    task.cancel()
    await asyncio.to_thread(ec2_stack.machines.kill_all)
    metadata.close()
    with contextlib.suppress(asyncio.CancelledError):
        await task  # raises what ended it early, if a step did: no machine was booted or halted after that


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(ec2_stack):
    async with admin_client(ec2_stack.stack) as api:
        yield api


def jwt_name(creds: str) -> str:
    token = creds.split("-----BEGIN NATS USER JWT-----")[1].split("------END NATS USER JWT------")[0].strip()
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["name"]


async def test_a_rented_instance_registers_runs_a_job_is_released_and_billed(aws, ec2_stack, cloud, client, project):
    job = await submit(
        client,
        project,
        command="echo trained-on-ec2",
        gpu_count=1,
        priority="time",
        expected_duration_s=1800,
        checkpoint_interval_s=600,
    )  # spot: only for jobs that checkpoint
    done = await wait_phase(client, project, job["metadata"]["id"], "Completed", "Failed", timeout_s=40)
    assert done["status"]["phase"] == "Completed", done["status"]
    node_id = done["status"]["node_ids"][0]
    assert node_id.startswith("od-g-small-spot-")
    instance = cloud.instance_of(node_id)
    script = cloud.scripts[instance]
    creds = script.split("agent.creds\" <<'")[1].split("\n", 1)[1]
    assert jwt_name(creds) == f"agent-{node_id}"  # its own identity, minted for it
    assert "TRAINMASTER_NATS_MINTER" not in script and ADMIN_TOKEN not in script
    told = (ec2_stack.machines.firewall() / "nft.log").read_text()  # before its agent started: the job ran
    assert "ip daddr 169.254.169.254 meta skuid >= 200000 reject" in told  # its tasks kept from the instance metadata

    async def terminated():
        [item] = [i for i in instances(aws, ec2_stack.cluster) if i["InstanceId"] == instance]
        return item["State"]["Name"] in ("shutting-down", "terminated")

    await poll(terminated, timeout_s=20)  # idle for 2 s: given back

    async def charged():  # from rent to release, at the spot price
        report = (await client.get(f"/v2/{project}/usage")).json()
        return report if report["on_demand"]["nodes"] == 1 and report["on_demand"]["seconds"] > 0 else None

    report = await poll(charged, timeout_s=20)
    assert report["on_demand"]["cost"] == pytest.approx(report["on_demand"]["seconds"] * 0.4 / 3600, rel=1e-3)


async def test_a_spot_notice_snapshots_the_job_and_it_resumes_elsewhere(aws, ec2_stack, cloud, client, project):
    job = await submit(
        client,
        project,
        command=counter(total=60, every=5, pause=0.1, resumed_pause=0.01),
        gpu_count=1,
        priority="time",
        expected_duration_s=1800,
        checkpoint_interval_s=60,
    )
    job_id = job["metadata"]["id"]
    running = await wait_phase(client, project, job_id, "Running", timeout_s=30)
    first = running["status"]["node_ids"][0]
    counting = await logs_containing(client, project, job_id, "step 12", timeout_s=60)
    assert "step 12" in counting, counting  # the notice comes once the first attempt has checkpointed
    instance = cloud.instance_of(first)
    assert cloud.metadata.reads.get(instance)  # its agent watches its own metadata
    cloud.metadata.interruptions[instance] = {"action": "terminate", "time": "2026-11-23T18:00:00Z"}

    async def resumed():
        current = await get(client, project, job_id)
        return current if current["status"]["phase"] == "Completed" else None

    done = await poll(resumed, timeout_s=50)
    text = await logs_containing(client, project, job_id, "saved", "resumed from")
    assert "saved" in text  # the SIGTERM checkpoint of the interrupted attempt
    assert done["status"]["node_ids"][0] != first
    resumed_from = [int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "resumed from" in line]
    assert resumed_from[0] == 0 and resumed_from[-1] > 0


async def test_an_instance_rented_but_never_recorded_is_terminated(aws, ec2_stack, cloud):
    tags = [
        {"Key": "trainmaster:cluster", "Value": ec2_stack.cluster},
        {"Key": "trainmaster:node-id", "Value": "od-lost-in-a-crash"},
        {"Key": "trainmaster:instance-type", "Value": "g.small.spot"},
    ]
    made = aws.ec2.run_instances(
        ImageId=aws.image,
        InstanceType="g5.xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    orphan = made["Instances"][0]["InstanceId"]

    async def terminated():
        [item] = [i for i in instances(aws, ec2_stack.cluster) if i["InstanceId"] == orphan]
        return item["State"]["Name"] in ("shutting-down", "terminated")

    await poll(terminated, timeout_s=15)  # by placement's reconcile loop
