"""The Kubernetes provider against kmock's Kubernetes API emulator on 127.0.0.1. The test acts as the kubelet: for
each Pod it mounts the Secret (writes its files) and runs the container's command as a local process, with the
container's environment, and stops it when the Pod is deleted."""

import asyncio
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import pytest_asyncio

from services.placement.adapter import catalogue_from
from services.placement.providers.cloud import NodeMaker, offer_infos
from tests.conftest import admin_client, start_stack, stop_later
from tests.e2e.helpers import submit, wait_phase
from tests.factories import L4_ENTRY
from tests.integration.clouds import Machines, agent_command, poll

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
pytest.importorskip("kmock")
from tests.integration.kube import Served  # noqa: E402

NAMESPACE = "trainmaster"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def k8s():
    async with Served() as k8s:
        yield k8s


def entry(name: str = "l4.1x") -> dict:
    return {
        **L4_ENTRY,
        "name": name,
        "startup_delay_s": 0,
        "provider": "kubernetes",
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
    }


def provider(k8s, tmp_path: Path, *, cluster: str | None = None):
    from services.placement.providers.kubernetes import KubernetesProvider, KubernetesSettings

    settings = KubernetesSettings(
        api_url=k8s.url,
        namespace=NAMESPACE,
        image="registry.local/trainmaster:1",
        cluster_name=cluster or f"c{uuid.uuid4().hex[:8]}",
        bus_url="nats://bus:4222",
    )
    return KubernetesProvider(
        settings=settings, offers=offer_infos([entry()]), maker=NodeMaker(boot=settings, folder=tmp_path)
    ), catalogue_from([entry()])


async def listed(k8s, kind: str, cluster: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=k8s.url) as api:
        items = (await api.get(f"/api/v1/namespaces/{NAMESPACE}/{kind}")).json()["items"]
    return [i for i in items if i["metadata"]["labels"].get("trainmaster.io/cluster") == cluster]


async def test_a_node_is_a_pod_with_its_gpus_its_selector_and_its_files_in_a_secret(k8s, tmp_path):
    kube, catalogue = provider(k8s, tmp_path)
    kube.maker.job_of = lambda node_id: "job-7"
    await kube.provision("od-l4-1", catalogue[0])
    cluster = kube.settings.cluster_name
    [pod], [secret] = await listed(k8s, "pods", cluster), await listed(k8s, "secrets", cluster)
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert container["image"] == "registry.local/trainmaster:1"
    assert container["command"][-4:] == ["--node-id", "od-l4-1", "--cluster-file", "/etc/trainmaster/cluster.toml"]
    assert pod["metadata"]["annotations"] == {"trainmaster.io/job": "job-7"}
    assert spec["volumes"][0]["secret"]["secretName"] == secret["metadata"]["name"] == pod["metadata"]["name"]
    assert 'id = "od-l4-1"' in secret["stringData"]["cluster.toml"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TRAINMASTER_NATS_URL"] == "nats://bus:4222" and "TRAINMASTER_NATS_MINTER" not in env
    await kube.release("od-l4-1", None)
    assert await listed(k8s, "pods", cluster) == [] and await listed(k8s, "secrets", cluster) == []
    await kube.release("od-l4-1", None)  # again: already gone, no error


async def test_reconcile_deletes_what_no_record_owns_and_only_that(k8s, tmp_path):
    kube, catalogue = provider(k8s, tmp_path)
    other, _ = provider(k8s, tmp_path)  # another cluster sharing the namespace
    for node_id in ("od-kept", "od-crashed"):
        await kube.provision(node_id, catalogue[0])
    await other.provision("od-theirs", catalogue[0])
    orphans = await kube.reconcile({"od-kept"})
    assert [(o.node_id, o.instance_type) for o in orphans] == [("od-crashed", "l4.1x")]
    names = lambda items: sorted(i["metadata"]["labels"]["trainmaster.io/node-id"] for i in items)  # noqa: E731
    assert names(await listed(k8s, "pods", kube.settings.cluster_name)) == ["od-kept"]
    assert names(await listed(k8s, "secrets", kube.settings.cluster_name)) == ["od-kept"]
    assert names(await listed(k8s, "pods", other.settings.cluster_name)) == ["od-theirs"]


async def test_a_pod_that_fails_is_reported_by_the_watch_and_a_released_one_is_not(k8s, tmp_path):
    kube, catalogue = provider(k8s, tmp_path)
    gone: asyncio.Queue = asyncio.Queue()
    watch = asyncio.create_task(kube.watch(lambda node_id, reason: gone.put((node_id, reason))))
    try:
        for node_id in ("od-failing", "od-idle"):
            await kube.provision(node_id, catalogue[0])
        await kube.release("od-idle", None)  # placement's own deletion is no failure
        async with httpx.AsyncClient(base_url=k8s.url) as api:
            await api.patch(
                f"/api/v1/namespaces/{NAMESPACE}/pods/tm-od-failing/status",
                json={"status": {"phase": "Failed", "reason": "OOMKilled"}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
        assert await asyncio.wait_for(gone.get(), timeout=10) == ("od-failing", "pod failed (OOMKilled)")
        assert gone.empty()
    finally:
        watch.cancel()
        await kube.close()


async def test_release_waits_for_the_pod_to_be_gone_then_deletes_its_secret(k8s, tmp_path):
    kube, catalogue = provider(k8s, tmp_path)
    cluster = kube.settings.cluster_name
    await kube.provision("od-slow", catalogue[0])
    pod_url = f"/api/v1/namespaces/{NAMESPACE}/pods/tm-od-slow"
    merge = {"Content-Type": "application/merge-patch+json"}
    async with httpx.AsyncClient(base_url=k8s.url) as api:
        # a finalizer keeps it terminating, as a kubelet does while the agent stops its tasks
        await api.patch(pod_url, json={"metadata": {"finalizers": ["kubelet.test/stopping"]}}, headers=merge)
        release = asyncio.create_task(kube.release("od-slow", None))

        async def terminating():
            return (await api.get(pod_url)).json()["metadata"].get("deletionTimestamp")

        await poll(terminating, timeout_s=10)
        assert not release.done() and len(await listed(k8s, "secrets", cluster)) == 1
        await api.patch(pod_url, json={"metadata": {"finalizers": None}}, headers=merge)  # the agent has stopped
        await asyncio.wait_for(release, timeout=10)
    assert await listed(k8s, "pods", cluster) == [] and await listed(k8s, "secrets", cluster) == []
    await kube.close()


# --- The whole stack renting Pods ---------------------------------------------------------------------------------
FLEET = """
[[instance_types]]
name = "l4.1x"
provider = "kubernetes"
gpus = 1
gpu_model = "L4"
gpu_memory_gb = 24
tflops = 121
cpu = 4
memory_gb = 16
price_per_hour = 0.8
startup_delay_s = 1
node_selector = {{ "nvidia.com/gpu.product" = "NVIDIA-L4" }}

[providers.kubernetes]
api_url = "{url}"
namespace = "trainmaster"
image = "registry.local/trainmaster:1"
cluster_name = "{cluster}"
agent_command = "{agent}"
agent_env = {{ TRAINMASTER_USE_NVML = "false", TRAINMASTER_HEARTBEAT_INTERVAL_S = "0.5" }}
"""
TUNING = {"TRAINMASTER_IDLE_RELEASE_S": "2", "TRAINMASTER_SCHEDULE_TICK_S": "1", "TRAINMASTER_RECONCILE_S": "1"}


class Kubelet:
    """Runs each Pod of the cluster as a local process: its Secret mounted (written) where the Pod says, its
    volumes' paths mapped to the Pod's own directories, as a container's mount namespace would."""

    def __init__(self, k8s, cluster: str, machines: Machines) -> None:
        self.k8s, self.cluster, self.machines = k8s, cluster, machines
        self.started: dict[str, dict] = {}

    async def run(self) -> None:
        async with httpx.AsyncClient(base_url=self.k8s.url) as api:
            while True:
                await self.step(api)
                await asyncio.sleep(0.3)

    async def step(self, api: httpx.AsyncClient) -> None:
        pods = {p["metadata"]["name"]: p for p in await listed(self.k8s, "pods", self.cluster)}
        for name, pod in pods.items():
            if name not in self.started:
                self.started[name] = pod
                await self.start(api, pod)
        for name in [n for n in self.machines.running if n not in pods]:
            await asyncio.to_thread(self.machines.halt, name)

    async def start(self, api: httpx.AsyncClient, pod: dict) -> None:
        name, container = pod["metadata"]["name"], pod["spec"]["containers"][0]
        root = self.machines.root / name
        paths = {}
        for mount in container["volumeMounts"]:
            volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
            local = root / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "secret" in volume:
                secret = (
                    await api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{volume['secret']['secretName']}")
                ).json()
                for key, text in secret["stringData"].items():
                    (local / key).write_text(text)
            paths[mount["mountPath"]] = str(local)

        def mapped(value: str) -> str:
            return next((value.replace(m, p, 1) for m, p in paths.items() if value.startswith(m)), value)

        env = {e["name"]: mapped(e["value"]) for e in container["env"]}
        self.machines.boot(name, [mapped(a) for a in container["command"]], env=env)
        await api.patch(
            f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status",
            json={"status": {"phase": "Running"}},
            headers={"Content-Type": "application/merge-patch+json"},
        )


@pytest.fixture(scope="module")
def k8s_stack(k8s, tmp_path_factory, servers):
    data = tmp_path_factory.mktemp("k8s")
    cluster = f"it-{uuid.uuid4().hex[:8]}"
    fleet = FLEET.format(url=k8s.url, cluster=cluster, agent=agent_command())
    stack = start_stack(data, cluster=fleet, servers=servers, extra_env=TUNING)
    yield SimpleNamespace(stack=stack, cluster=cluster, machines=Machines(data / "pods"))
    stop_later(stack)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def kubelet(k8s, k8s_stack):
    kubelet = Kubelet(k8s, k8s_stack.cluster, k8s_stack.machines)
    task = asyncio.create_task(kubelet.run())
    yield kubelet
    task.cancel()
    await asyncio.to_thread(k8s_stack.machines.halt_all)


async def test_a_rented_pod_registers_runs_a_job_and_is_deleted_when_idle(k8s, k8s_stack, kubelet, project):
    async with admin_client(k8s_stack.stack) as client:
        job = await submit(
            client, project, command="echo trained-in-a-pod", gpu_count=1, priority="time", expected_duration_s=1800
        )
        done = await wait_phase(client, project, job["metadata"]["id"], "Completed", "Failed", timeout_s=40)
        assert done["status"]["phase"] == "Completed", done["status"]
        node_id = done["status"]["node_ids"][0]
        assert node_id.startswith("od-l4-1x-")
        pod = next(p for p in kubelet.started.values() if p["metadata"]["labels"]["trainmaster.io/node-id"] == node_id)
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"

        async def deleted():
            return not [
                p
                for p in await listed(k8s, "pods", k8s_stack.cluster)
                if p["metadata"]["name"] == pod["metadata"]["name"]
            ]

        await poll(deleted, timeout_s=20)  # idle for 2 s: given back

        async def charged():
            report = (await client.get(f"/v2/{project}/usage")).json()
            return report if report["on_demand"]["nodes"] == 1 and report["on_demand"]["seconds"] > 0 else None

        report = await poll(charged, timeout_s=20)
        assert report["on_demand"]["cost"] == pytest.approx(report["on_demand"]["seconds"] * 0.8 / 3600, rel=1e-3)


async def test_the_clusters_pods_are_kept_from_the_instance_metadata_by_a_network_policy(k8s, tmp_path):
    """A task is anyone's code, and the node's metadata service serves its role's keys: the Pods had no rule like
    the EC2 nodes' firewall (found by review). One policy per cluster, made at its first rent."""
    kube, catalogue = provider(k8s, tmp_path)
    cluster = kube.settings.cluster_name
    await kube.provision("od-l4-2", catalogue[0])
    await kube.provision("od-l4-3", catalogue[0])
    async with httpx.AsyncClient(base_url=k8s.url) as api:
        items = (await api.get(f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies")).json()["items"]
    [policy] = [i for i in items if i["metadata"]["labels"].get("trainmaster.io/cluster") == cluster]
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"trainmaster.io/cluster": cluster}}
    assert spec["policyTypes"] == ["Egress"]
    blocks = [rule["to"][0]["ipBlock"] for rule in spec["egress"]]
    assert blocks == [
        {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]},
        {"cidr": "::/0", "except": ["fd00:ec2::254/128"]},
    ]
    for node_id in ("od-l4-2", "od-l4-3"):
        await kube.release(node_id, None)
