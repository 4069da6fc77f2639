"""What a rented node is started with: the cloud-init script and the Pod, rendered from the node's bundle."""

import dataclasses
import shutil
import subprocess

import pytest
from pydantic import ValidationError

from services.agent.app import AgentSettings
from services.agent.fence import margin_problem
from services.placement.policy import InstanceType
from services.placement.providers.bootstrap import (
    Bootstrap,
    Liveness,
    NodeBoot,
    agent_env,
    pod_manifest,
    user_data,
)
from services.placement.providers.wiring import make_providers
from tests.factories import L4_ENTRY

BOOT = Bootstrap(
    node_id="od-a",
    cluster_entry='[[nodes]]\nid = "od-a"\n',
    env={"TRAINMASTER_NATS_URL": "nats://bus:4222", "TRAINMASTER_X": "it's $(rm -rf /)"},
    creds="-----BEGIN NATS USER JWT-----\nabc\n------END NATS USER JWT------\n",
)
ENTRY = L4_ENTRY
BASH = shutil.which("bash") or "/bin/bash"
INSTANCE = InstanceType(**ENTRY, startup_delay_s=0)


def machine_path(tmp_path, *, firewall: str | None) -> str:
    """A PATH of the tools the script uses and, for `firewall` ("nft" or "iptables"), a stand-in that records what
    it was told (in the file of its name beside it): never this host's own firewall."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("mkdir", "cat", "echo"):
        (tools / name).symlink_to(shutil.which(name))
    if firewall:
        (tools / firewall).write_text(
            f'#!/bin/bash\n{{ echo "$*"; [ "$1" != -f ] || cat; }} >> {tools}/{firewall}.log\n'
        )
        (tools / firewall).chmod(0o755)
    return str(tools)


def test_the_script_writes_the_nodes_files_verbatim_and_starts_its_agent(tmp_path):
    script = user_data(BOOT, root=str(tmp_path / "node"), install_command="", agent_command="echo agent")
    path = machine_path(tmp_path, firewall="nft")
    out = subprocess.run([BASH, "-c", script], capture_output=True, text=True, timeout=20, env={"PATH": path})
    assert out.returncode == 0, out.stderr
    root = tmp_path / "node"
    assert (root / "cluster.toml").read_text() == BOOT.cluster_entry
    assert (root / "agent.creds").read_text() == BOOT.creds
    assert oct((root / "agent.creds").stat().st_mode & 0o777) == "0o600"
    assert (root / "agent.log").read_text().strip() == f"agent --node-id od-a --cluster-file {root}/cluster.toml"
    check = subprocess.run(
        ["bash", "-c", f'. {root}/agent.env; printf %s "$TRAINMASTER_X"'], capture_output=True, text=True, timeout=10
    )
    assert check.stdout == "it's $(rm -rf /)"  # quoted, never run


def test_placements_own_secrets_never_reach_a_node():
    for name in ("TRAINMASTER_NATS_MINTER", "TRAINMASTER_ADMIN_TOKEN", "MONGO_URL", "bad-name"):
        with pytest.raises(ValueError, match="agent_env"):
            agent_env(
                NodeBoot(bus_url="nats://b", agent_env={name: "x"}), root="/r", spot=False, has_creds=True, has_ca=False
            )


def test_a_spot_node_watches_its_metadata_and_an_on_demand_one_does_not():
    boot = NodeBoot(bus_url="nats://b")
    assert (
        agent_env(boot, root="/r", spot=True, has_creds=True, has_ca=False)["TRAINMASTER_SPOT_METADATA_URL"]
        == "http://169.254.169.254"
    )
    assert "TRAINMASTER_SPOT_METADATA_URL" not in agent_env(boot, root="/r", spot=False, has_creds=True, has_ca=False)


def test_the_pod_asks_for_its_gpus_and_mounts_its_secret_read_only():
    pod = pod_manifest(
        BOOT,
        name="tm-od-a",
        labels={"a": "b"},
        image="img",
        gpus=2,
        cpu=8,
        memory_gb=32,
        node_selector={"k": "v"},
        mount="/etc/tm",
        data_dir="/var/lib/tm",
        agent_command="agent",
    )
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "8", "memory": "32768Mi", "nvidia.com/gpu": "2"}
    assert {"name": "node", "mountPath": "/etc/tm", "readOnly": True} in container["volumeMounts"]
    assert pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"


async def test_a_rented_agent_gets_the_stacks_heartbeat_and_node_timeout_and_its_fence_fits_them(tmp_path, monkeypatch):
    """Placement's own interval and timeout (the monitor's) travel with a rented node's agent settings, and the
    agent fits its fence margin and grace to them: with its 4 s default margin under a 3 s timeout it would not
    start (its settings' check); the provider's own agent_env still wins."""
    providers = make_providers(
        entries=[{**ENTRY, "provider": "kubernetes"}],
        sections={"kubernetes": {"image": "i:1", "cluster_name": "c1", "api_url": "https://kube.invalid"}},
        default="local-process",
        data_dir=tmp_path,
        broker=None,
        nats_url="nats://bus:4222",
        minter=None,
        ca_file=None,
        liveness=Liveness(heartbeat_interval_s=0.5, node_timeout_s=3.0),
    )
    boot = await providers.by_name["kubernetes"].maker.bundle("od-a", INSTANCE, root="/r", spot=False)
    assert (boot.env["TRAINMASTER_HEARTBEAT_INTERVAL_S"], boot.env["TRAINMASTER_NODE_TIMEOUT_S"]) == ("0.5", "3.0")
    for name, value in boot.env.items():
        monkeypatch.setenv(name, value)
    settings = AgentSettings(node_id="od-a")
    assert (settings.node_timeout_s, settings.heartbeat_interval_s) == (3.0, 0.5)
    assert (
        settings.fence
        and margin_problem(
            timeout_s=3.0, margin_s=settings.fence_margin_s, grace_s=settings.fence_grace_s, interval_s=0.5
        )
        is None
    )
    assert settings.fence_margin_s < 4.0 and settings.fence_grace_s > 0
    own = NodeBoot(bus_url="nats://b", agent_env={"TRAINMASTER_HEARTBEAT_INTERVAL_S": "0.25"})
    timing = Liveness(heartbeat_interval_s=2.0, node_timeout_s=10.0)
    env = agent_env(own, root="/r", spot=False, has_creds=False, has_ca=False, liveness=timing)
    assert (env["TRAINMASTER_HEARTBEAT_INTERVAL_S"], env["TRAINMASTER_NODE_TIMEOUT_S"]) == ("0.25", "10.0")


def test_an_agent_fits_an_unset_fence_to_its_node_timeout_and_keeps_what_is_set():
    assert (AgentSettings(node_id="n").fence_margin_s, AgentSettings(node_id="n").fence_grace_s) == (4.0, 1.0)
    short = AgentSettings(node_id="n", node_timeout_s=3.0, heartbeat_interval_s=0.5)
    assert (round(short.fence_margin_s, 3), round(short.fence_grace_s, 3)) == (1.2, 0.225)
    chosen = AgentSettings(node_id="n", node_timeout_s=3.0, heartbeat_interval_s=0.5, fence_margin_s=1.0)
    assert (chosen.fence_margin_s, chosen.fence_grace_s) == (1.0, 0.125)  # the grace fitted to the margin set
    with pytest.raises(ValidationError, match="two heartbeat intervals"):  # no fence fits: said, not guessed
        AgentSettings(node_id="n", node_timeout_s=3.0, heartbeat_interval_s=2.0)


@pytest.mark.parametrize("cloud", ["ec2", "kubernetes"])
def test_local_processes_beside_a_cloud_the_minter_checks_do_not_start(tmp_path, cloud):
    """Every such rental was refused its consumer maker by the minter (no cloud lists a local process), a
    revocation spent at each try (rev10 M1); the refusal names the instance type."""
    with pytest.raises(
        SystemExit, match=f"instance type 'g-local': provider local-process beside \\[providers.{cloud}\\]"
    ):
        make_providers(
            entries=[{**ENTRY, "name": "g-local", "provider": "local-process"}, {**ENTRY, "provider": cloud}],
            sections={cloud: {}},
            default="local-process",
            data_dir=tmp_path,
            broker=None,
            nats_url="nats://bus:4222",
            minter=tmp_path / "placement.creds",
            ca_file=None,
        )


@pytest.mark.parametrize("firewall", ["nft", "iptables"])
def test_no_task_reaches_the_instance_metadata_which_serves_the_nodes_credentials(tmp_path, firewall):
    """The node's bus credentials are in its user data, which the metadata service serves for the instance's life;
    a task could ask for it (IMDSv2's token is one PUT away from any process): found by review. Only root (the agent,
    its spot watch) may reach it, told to the firewall before the agent starts."""
    script = user_data(BOOT, root=str(tmp_path / "node"), install_command="", agent_command="echo agent")
    path = machine_path(tmp_path, firewall=firewall)
    out = subprocess.run([BASH, "-c", script], capture_output=True, text=True, timeout=20, env={"PATH": path})
    assert out.returncode == 0, out.stderr
    told = (tmp_path / "bin" / f"{firewall}.log").read_text()
    # the task uids only (from 200,000 up): the image's daemons (EC2 Instance Connect, the CloudWatch agent) and the
    # agent's spot watch keep the metadata (the first version refused every uid but root: found by review)
    if firewall == "nft":
        assert "ip daddr 169.254.169.254 meta skuid >= 200000 reject" in told and "fd00:ec2::254" in told
    else:
        assert "-I OUTPUT -d 169.254.169.254 -m owner --uid-owner 200000-4294967294 -j REJECT" in told
    assert (tmp_path / "node" / "agent.log").exists()


def test_a_node_without_a_firewall_to_tell_does_not_start_its_agent(tmp_path):
    script = user_data(BOOT, root=str(tmp_path / "node"), install_command="", agent_command="echo agent")
    path = machine_path(tmp_path, firewall=None)
    out = subprocess.run([BASH, "-c", script], capture_output=True, text=True, timeout=20, env={"PATH": path})
    assert out.returncode == 1 and "agent is not started" in out.stderr
    assert not (tmp_path / "node" / "agent.log").exists()


def test_an_operator_who_starts_task_uids_lower_has_them_refused_from_there():
    boot = dataclasses.replace(BOOT, env={**BOOT.env, "TRAINMASTER_TASK_UID_FIRST": "150000"})
    script = user_data(boot, root="/r", install_command="", agent_command="agent")
    assert "meta skuid >= 150000 reject" in script and "--uid-owner 150000-4294967294" in script
