"""What a rented node is started with: the cloud-init user data of an EC2 instance, the Secret and Pod of a
Kubernetes node. Pure rendering; the agent's own minted credentials travel in them, nothing of placement's."""

import re
import secrets
import shlex
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from shared.nodes import TASK_UID_FLOOR

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
FORBIDDEN_ENV = frozenset({"TRAINMASTER_NATS_MINTER", "TRAINMASTER_ADMIN_TOKEN", "MONGO_URL"})  # placement's own


class NodeBoot(BaseModel):
    """Settings every cloud provider shares: how a rented node reaches the bus and starts its agent."""

    model_config = ConfigDict(extra="forbid")

    bus_url: str = Field(
        "",
        description="The NATS URL as rented nodes reach it; placement's own when empty "
        "(right only when that one is reachable from the nodes, not 127.0.0.1).",
    )
    cluster_name: str = Field(
        "trainmaster",
        pattern=r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$",
        description="Tags/labels every rented node with it; reconcile owns only these.",
    )
    agent_command: str = Field("trainmaster-agent", description="How the node starts the agent.")
    install_command: str = Field("", description="Run before the agent starts (EC2), e.g. `pip install ...`.")
    node_root: str = Field("/var/lib/trainmaster", description="Where the node keeps its agent's files.")
    agent_env: dict[str, str] = Field(default_factory=dict, description="More agent settings (storage URLs ...).")
    release_wait_s: float = Field(
        30,
        ge=0,
        le=300,
        description="How long a release waits for the machine to be "
        "gone (its agent reporting its tasks' ends) before revoking its credentials.",
    )
    spot_metadata_url: str = Field(
        "http://169.254.169.254",
        description="Instance metadata the agent of a spot node watches for the interruption notice.",
    )


@dataclass(frozen=True)
class Liveness:
    """How the stack judges its nodes (placement's own settings, the monitor's): every rented agent gets them, or it
    would heartbeat and fence by its defaults (a 10 s timeout) under a monitor that calls it lost sooner."""

    heartbeat_interval_s: float
    node_timeout_s: float

    def env(self) -> dict[str, str]:
        return {
            "TRAINMASTER_HEARTBEAT_INTERVAL_S": repr(self.heartbeat_interval_s),
            "TRAINMASTER_NODE_TIMEOUT_S": repr(self.node_timeout_s),
        }


@dataclass(frozen=True)
class Bootstrap:
    """One node's start: its cluster-file entry, its agent's settings and its own bus credentials."""

    node_id: str
    cluster_entry: str
    env: dict[str, str] = field(default_factory=dict)
    creds: str | None = None
    ca: str | None = None


def agent_env(
    boot: NodeBoot,
    *,
    root: str,
    spot: bool,
    has_creds: bool,
    has_ca: bool,
    data_dir: str | None = None,
    liveness: Liveness | None = None,
) -> dict[str, str]:
    """The agent's TRAINMASTER_* settings on the node (its files under `root`, its state in `data_dir`); the
    stack's heartbeat interval and node timeout unless the provider's `agent_env` says otherwise (its agent fits
    its fence to them)."""
    timing = liveness.env() if liveness else {}
    env = {**timing, **boot.agent_env, "TRAINMASTER_NATS_URL": boot.bus_url}
    env["TRAINMASTER_DATA_DIR"] = data_dir or f"{root}/data"
    if has_creds:  # the start identity, traded at once for one of a key the agent makes (services/agent/rekey.py)
        env["TRAINMASTER_NATS_CREDS"] = f"{root}/agent.creds"
        env["TRAINMASTER_NATS_REKEY"] = "true"
    if has_ca:
        env["TRAINMASTER_NATS_CA_FILE"] = f"{root}/ca.pem"
    if spot:
        env["TRAINMASTER_SPOT_METADATA_URL"] = boot.spot_metadata_url
    for name in env:
        if not ENV_NAME.match(name) or name in FORBIDDEN_ENV:
            raise ValueError(f"agent_env: {name!r} is not an agent setting a node may get")
    return env


# No task may reach the instance metadata service: it serves the node's user data (this script, the node's bus
# credentials in it) for as long as the instance lives, and the instance role's keys; a task is anyone's code, and
# IMDSv2's token is one PUT away from it. Tasks run as uids from TASK_UID_FLOOR up (the agent is root under
# cloud-init), so only those are refused: the agent's spot watch and the image's daemons (EC2 Instance Connect, the
# CloudWatch agent) keep it. A node that cannot say so to its firewall does not start its agent (it is released
# unregistered): tasks never run on a node that would give its identity away.
METADATA_FIREWALL = r"""
if command -v nft >/dev/null 2>&1; then
    nft -f - <<'TRAINMASTER_NFT'
table inet trainmaster_metadata {
    chain output {
        type filter hook output priority 0; policy accept;
        ip daddr 169.254.169.254 meta skuid >= FIRST reject
        ip6 daddr fd00:ec2::254 meta skuid >= FIRST reject
    }
}
TRAINMASTER_NFT
elif command -v iptables >/dev/null 2>&1; then
    iptables -w -I OUTPUT -d 169.254.169.254 -m owner --uid-owner FIRST-4294967294 -j REJECT
    if command -v ip6tables >/dev/null 2>&1; then
        ip6tables -w -I OUTPUT -d fd00:ec2::254 -m owner --uid-owner FIRST-4294967294 -j REJECT || true  # no IPv6
    fi
else
    echo "trainmaster: neither nft nor iptables to keep tasks from the instance metadata: the agent is not started" >&2
    exit 1
fi
""".strip("\n")


def metadata_firewall(env: dict[str, str]) -> str:
    """`METADATA_FIREWALL` for the node's task uids: from its agent's first (TRAINMASTER_TASK_UID_FIRST, where the
    operator set one lower) or TASK_UID_FLOOR."""
    first = min(TASK_UID_FLOOR, int(env.get("TRAINMASTER_TASK_UID_FIRST") or TASK_UID_FLOOR))
    return METADATA_FIREWALL.replace("FIRST", str(first))


def user_data(boot: Bootstrap, *, root: str, install_command: str, agent_command: str) -> str:
    """A cloud-init shell script: write the node's files (0600), install, keep tasks from the instance metadata
    (`METADATA_FIREWALL`), start the agent in the foreground."""
    files = {
        "cluster.toml": boot.cluster_entry,
        "agent.env": "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(boot.env.items())),
    }
    if boot.creds:
        files["agent.creds"] = boot.creds
    if boot.ca:
        files["ca.pem"] = boot.ca
    lines = [
        "#!/bin/bash",
        f"# trainmaster node {boot.node_id}: written by placement, run once by cloud-init",
        "set -euo pipefail",
        "umask 077",
        f"ROOT={shlex.quote(root)}",
        'mkdir -p "$ROOT/data"',
    ]
    for name, text in files.items():
        end = _delimiter(text)
        lines += [f"cat > \"$ROOT/{name}\" <<'{end}'", text.rstrip("\n"), end]
    if install_command:
        lines.append(install_command)
    lines.append(metadata_firewall(boot.env))
    lines += [
        'set -a; . "$ROOT/agent.env"; set +a',
        f'exec {agent_command} --node-id {shlex.quote(boot.node_id)} --cluster-file "$ROOT/cluster.toml" '
        '>> "$ROOT/agent.log" 2>&1',
    ]
    return "\n".join(lines) + "\n"


def secret_manifest(boot: Bootstrap, *, name: str, labels: dict[str, str]) -> dict:
    """The node's files as a Secret (mounted read-only into its Pod)."""
    data = {"cluster.toml": boot.cluster_entry}
    if boot.creds:
        data["agent.creds"] = boot.creds
    if boot.ca:
        data["ca.pem"] = boot.ca
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "labels": labels},
        "stringData": data,
    }


def pod_manifest(
    boot: Bootstrap,
    *,
    name: str,
    labels: dict[str, str],
    image: str,
    gpus: int,
    cpu: float,
    memory_gb: float,
    node_selector: dict[str, str],
    mount: str,
    data_dir: str,
    agent_command: str,
    service_account: str | None = None,
) -> dict:
    """The node as a Pod: the agent image with the node's GPUs as `nvidia.com/gpu` limits."""
    limits = {"cpu": f"{cpu:g}", "memory": f"{int(memory_gb * 1024)}Mi"}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    spec = {
        "restartPolicy": "Never",  # a node that died is released and rented again, never silently restarted
        "nodeSelector": node_selector,
        "automountServiceAccountToken": False,  # the agent needs no Kubernetes API access
        "containers": [
            {
                "name": "agent",
                "image": image,
                "command": [
                    *shlex.split(agent_command),
                    "--node-id",
                    boot.node_id,
                    "--cluster-file",
                    f"{mount}/cluster.toml",
                ],
                "env": [{"name": k, "value": v} for k, v in sorted(boot.env.items())],
                "resources": {"limits": limits, "requests": dict(limits)},
                "volumeMounts": [
                    {"name": "node", "mountPath": mount, "readOnly": True},
                    {"name": "data", "mountPath": data_dir},
                ],
            }
        ],
        "volumes": [
            {"name": "node", "secret": {"secretName": name, "defaultMode": 0o400}},
            {"name": "data", "emptyDir": {}},
        ],
    }
    if service_account:
        spec["serviceAccountName"] = service_account
    if gpus:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def _delimiter(text: str) -> str:
    while True:
        end = f"TRAINMASTER_EOF_{secrets.token_hex(4)}"
        if end not in text:
            return end
