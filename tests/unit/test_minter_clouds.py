"""The minter checks each rented node against the provider that rented it (EC2, Kubernetes), never "either says
yes": the decisions (pure), what it reads of a Pod, and the settings of its own credentials."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shared import busroles
from shared.buscreds import new_seed, public_key, write_secret
from shared.cloudtags import LABEL_CLUSTER, LABEL_NODE, pod_name
from shared.minting import MINT_CONSUMER_MAKER, MintAgent, RevokeNode
from services.minter.app import MinterProcess, MinterSettings
from services.minter.bucket import TokenBucket
from services.minter.pods import launched_pods
from services.minter.rules import Limits, Refused, checked_by, mint_agent, revoke_node, unlaunched
from tests.unit.test_bus_roles import minter
from tests.unit.test_stack_restart import stack_of

BOTH = frozenset({"ec2", "kubernetes"})
ROOT = Path(__file__).resolve().parents[2]


def limits(providers: frozenset[str]) -> Limits:
    return Limits(static=frozenset({"n1"}), max_rented_nodes=64, bucket=TokenBucket(64, 12), providers=providers)


def rent(m, node_id: str, provider: str | None, *, providers: frozenset[str] = BOTH, now: float = 1_000.0) -> None:
    mint_agent(m, MintAgent(node_id=node_id, provider=provider), limits=limits(providers), now=now, monotonic=now)


def test_each_node_is_checked_against_the_provider_that_rented_it_never_either():
    """With both providers configured a node rented from EC2 whose id a Pod of the cluster carries (anyone who may
    create Pods may label one) is still unlaunched, and a Pod's node that an EC2 instance tags likewise."""
    m = minter()
    rent(m, "od-ec2", "ec2")
    rent(m, "od-pod", "kubernetes")
    assert m.rented_from == {"od-ec2": "ec2", "od-pod": "kubernetes"}
    crossed = {"ec2": {"od-pod": {"i-1"}}, "kubernetes": {"od-ec2": {"uid-1"}}}
    assert unlaunched(m, launched=crossed, now=2_000, grace_s=100, providers=BOTH) == {
        "ec2": ["od-ec2"],
        "kubernetes": ["od-pod"],
    }
    own = {"ec2": {"od-ec2": {"i-1"}}, "kubernetes": {"od-pod": {"uid-1"}}}
    assert unlaunched(m, launched=own, now=2_000, grace_s=100, providers=BOTH) == {}
    revoke_node(m, RevokeNode(node_id="od-pod"))
    assert m.rented_from == {"od-ec2": "ec2"}


def test_a_node_no_configured_provider_vouches_for_gets_no_identity():
    m = minter()
    for provider, providers in (
        (None, BOTH),  # which one rented it?
        ("local-process", BOTH),
        ("kubernetes", frozenset({"ec2"})),
        ("ec2", frozenset({"kubernetes"})),
    ):
        with pytest.raises(Refused, match="checked against the provider that rented it"):
            rent(m, f"od-{provider}", provider, providers=providers)
    assert m.minted == {} and m.rented_from == {}


def test_where_one_provider_is_asked_a_request_may_leave_it_out_and_where_none_nothing_is_recorded():
    m = minter()
    rent(m, "od-1", None, providers=frozenset({"kubernetes"}))
    rent(m, "od-2", "kubernetes", providers=frozenset())
    assert m.rented_from == {"od-1": "kubernetes"} and set(m.minted) == {"od-1", "od-2"}


def test_a_node_minted_before_providers_were_recorded_is_checked_against_ec2_where_configured():
    """The minter asked EC2 only: a live identity from then, in a cluster now renting from both, is EC2's; one whose
    provider is no longer configured vouches for nothing (revoked at the sweep)."""
    m = minter()
    m.minted["od-old"] = [public_key(new_seed("user"))]
    assert checked_by(m, "od-old", providers=BOTH) == "ec2"
    assert checked_by(m, "od-old", providers=frozenset({"kubernetes"})) == "kubernetes"
    assert checked_by(m, "od-old", providers=frozenset()) is None
    m.rented_from["od-old"] = "ec2"
    assert unlaunched(
        m, launched={"kubernetes": {"od-old": {"uid-1"}}}, now=9, grace_s=0, providers=frozenset({"kubernetes"})
    ) == {"ec2": ["od-old"]}


def pod(node_id: str, *, cluster: str = "c1", phase: str | None = "Running", **meta) -> dict:
    labels = {LABEL_CLUSTER: cluster, LABEL_NODE: node_id}
    return {
        "metadata": {"name": pod_name(node_id), "labels": labels, "uid": f"uid-{node_id}", **meta},
        "status": {"phase": phase} if phase else {},
    }


def test_a_pod_vouches_for_its_own_node_only_while_pending_or_running():
    renamed = pod("od-named")
    renamed["metadata"]["name"] = "my-own-pod"  # labelled with a node's id, not that node's Pod
    pods = [
        pod("od-running"),
        pod("od-pending", phase="Pending"),
        pod("od-failed", phase="Failed"),
        pod("od-ended", phase="Succeeded"),
        pod("od-unknown", phase=None),
        pod("od-deleting", deletionTimestamp="2026-11-27T00:00:00Z"),
        pod("od-theirs", cluster="c2"),
        pod("od.*"),
        renamed,
        {"metadata": None, "status": "x"},
    ]
    assert launched_pods(pods, cluster="c1") == {"od-running": {"uid-od-running"}, "od-pending": {"uid-od-pending"}}


def test_empty_cloud_settings_are_unset(monkeypatch):
    """Compose passes an unset variable as an empty string: an empty key id would be sent to EC2 as one."""
    for names in MinterSettings.CLOUD_SETTINGS.values():
        for name in names:
            monkeypatch.setenv(f"TRAINMASTER_{name.upper()}", "")
    settings = MinterSettings()
    assert all(getattr(settings, n) is None for names in MinterSettings.CLOUD_SETTINGS.values() for n in names)


def test_a_minter_whose_cluster_rents_pods_and_that_has_no_way_to_the_api_does_not_start(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[providers.kubernetes]\nimage = "registry.local/trainmaster:1"\n')
    with pytest.raises(ValueError, match="TRAINMASTER_K8S_KUBECONFIG"):
        MinterProcess(MinterSettings(minter_file=tmp_path / "minter.json", cluster_file=cluster))
    cluster.write_text('[providers.kubernetes]\napi_url = "http://127.0.0.1:1"\n')
    process = MinterProcess(MinterSettings(minter_file=tmp_path / "minter.json", cluster_file=cluster))
    assert process.limits.providers == {"kubernetes"}


def test_a_minter_whose_cluster_rents_nothing_loads_no_cloud_client(tmp_path):
    """lightkube (with yaml and httpx) and boto3 are loaded only for a cluster that rents from their cloud: every
    minter start of a stack renting nothing paid about 0.9 s of CPU for lightkube, unused."""
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[[nodes]]\nid = "n1"\nkind = "local"\ncpu_count = 1\nmemory_gb = 1\nprice_per_hour = 0\n')
    probe = (
        "import sys\nfrom pathlib import Path\nfrom services.minter.app import MinterProcess, MinterSettings\n"
        f"MinterProcess(MinterSettings(minter_file=Path({str(tmp_path / 'minter.json')!r}), "
        f"cluster_file=Path({str(cluster)!r})))\n"
        "print(sorted(m for m in ('lightkube', 'yaml', 'httpx', 'boto3', 'botocore') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stderr


def test_compose_passes_the_minter_the_settings_of_its_own_cloud_credentials():
    """Compose gave the minter none of TRAINMASTER_EC2_*: its EC2 check ran with the environment's AWS keys (MinIO's),
    and every consumer maker was refused."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    environment = compose["minter"]["environment"]
    for names in MinterSettings.CLOUD_SETTINGS.values():
        for name in names:
            assert f"TRAINMASTER_{name.upper()}" in environment, name
    assert not environment.get("AWS_ACCESS_KEY_ID") and not environment.get("AWS_SECRET_ACCESS_KEY")  # not MinIO's
    assert not any(k.startswith(("TRAINMASTER_EC2_", "TRAINMASTER_K8S_")) for k in compose["placement"]["environment"])


def test_make_run_hands_the_shells_cloud_settings_to_the_minter_alone(tmp_path, monkeypatch):
    """The stack passes no TRAINMASTER_* of the shell to its processes: the minter's own keys never reached it."""
    names = [f"TRAINMASTER_{n.upper()}" for names in MinterSettings.CLOUD_SETTINGS.values() for n in names]
    for name in names:
        monkeypatch.setenv(name, f"value-of-{name}")
    stack = stack_of(tmp_path)
    minting = stack.env_of(busroles.MINTER)
    assert all(minting[name] == f"value-of-{name}" for name in names)
    for other in ("placement", "monitor", "submitter"):
        assert not set(names) & set(stack.env_of(other)), other


async def test_a_node_rented_from_a_provider_no_longer_configured_gets_no_consumer_maker(tmp_path):
    """Its recorded provider vouches for nothing once the cluster file drops it; no other is asked instead."""
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[providers.kubernetes]\napi_url = "http://127.0.0.1:1"\n')
    m = minter()
    rent(m, "od-1", "ec2")  # rented while the cluster file had [providers.ec2]
    write_secret(tmp_path / "minter.json", m.to_json())
    process = MinterProcess(MinterSettings(minter_file=tmp_path / "minter.json", cluster_file=cluster))
    with pytest.raises(Refused, match="rented from ec2, which the cluster file no longer configures"):
        await process.handle(MINT_CONSUMER_MAKER, b'{"node_id": "od-1"}')
