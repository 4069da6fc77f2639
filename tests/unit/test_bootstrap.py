"""What a rented node is started with: the cloud-init script and the Pod, rendered from the node's bundle."""

import subprocess

import pytest

from services.placement.providers.bootstrap import Bootstrap, NodeBoot, agent_env, pod_manifest, user_data

BOOT = Bootstrap(
    node_id="od-a",
    cluster_entry='[[nodes]]\nid = "od-a"\n',
    env={"TRAINMASTER_NATS_URL": "nats://bus:4222", "TRAINMASTER_X": "it's $(rm -rf /)"},
    creds="-----BEGIN NATS USER JWT-----\nabc\n------END NATS USER JWT------\n",
)


def test_the_script_writes_the_nodes_files_verbatim_and_starts_its_agent(tmp_path):
    script = user_data(BOOT, root=str(tmp_path / "node"), install_command="", agent_command="echo agent")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=20)
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
