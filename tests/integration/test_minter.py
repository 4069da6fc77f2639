"""A compromised placement against the real NATS server: what it is given mints no identity of its own choosing;
the minter grants it only an agent for one rented node (and that node's consumer maker), and revokes nothing else."""

import asyncio
import json
import re
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import nats
import pytest
import pytest_asyncio
from nats.errors import Error as NatsError

from shared import busroles
from shared.buscreds import Permissions, decode_claims, mint_user, public_key
from shared.cloudtags import LABEL_CLUSTER, LABEL_NODE, pod_name
from shared.minting import MINT_AGENT, REVOKE_NODE, MinterAnswer, RevokeNode
from services.placement.providers import NodeCredentials
from services.stack.processes import Stack
from tests.factories import unique
from tests.integration.clouds import loopback_only
from tests.integration.servers import real_servers, running_minter
from tests.integration.test_bus_security import CLUSTER, Client, agent_creds, as_agent, command_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("minted_revoked")]
SEED = re.compile(r"\bS[OAU][A-Z2-7]{56}\b")  # an nkey seed of an operator, an account or a user


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with real_servers(tmp_path_factory.mktemp("minter"), cluster=CLUSTER) as stack:
        yield stack


def given_to(server: Stack, identity: str) -> set[str]:
    """Every nkey seed in the files the stack's settings for a process name (what it holds)."""
    env = server.env_of(identity)
    files = [Path(v) for k, v in env.items() if k.startswith("TRAINMASTER_") and Path(v).is_file()]
    return {seed for path in files for seed in SEED.findall(path.read_text())}


async def ask(client: Client, subject: str, body: dict) -> MinterAnswer:
    reply = await client.nc.request(subject, json.dumps(body).encode(), timeout=5)
    return MinterAnswer.model_validate_json(reply.data)


async def test_nothing_placement_holds_signs_a_user_that_reads_every_nodes_commands(server):
    """Placement held the account's signing key (and the operator's): with it, a user allowed `>` read every node's
    commands and their job secrets."""
    account = public_key(server.identities.keys()["account"])
    seeds = given_to(server, "placement")
    assert seeds and all(seed.startswith("SU") for seed in seeds)  # its own user key: no operator's, no account's
    for seed in seeds:
        _, creds = mint_user(
            name="wide", account=account, signer_seed=seed, permissions=Permissions(publish=(">",), subscribe=(">",))
        )
        path = server.data_dir / "wide.creds"
        path.write_text(creds)
        try:
            wide = await Client().open(server, path)
        except NatsError:
            continue  # refused: not a key the account trusts
        seen: list[bytes] = []

        async def record(msg, seen=seen) -> None:
            seen.append(msg.data)

        await wide.nc.subscribe("tm.node.cmd.>", cb=record)
        await wide.nc.flush()
        command = await command_for(server, "n1")
        await wide.settle()
        await wide.nc.close()
        assert not any(command.job_id.encode() in data for data in seen)


async def test_the_minter_grants_no_static_node_no_wildcard_and_no_claims_of_the_requesters(server):
    placement = await Client().open(server, server.identities.creds("placement"), inbox=busroles.inbox("placement"))
    async with running_minter(server):
        for body in (
            {"node_id": "n1"},  # a node of the cluster file: its identity is the stack's
            {"node_id": "*"},
            {"node_id": ">"},
            {"node_id": "od.*"},
            {"node_id": unique("od"), "permissions": {"pub": {"allow": [">"]}}},
        ):
            answer = await ask(placement, MINT_AGENT, body)
            assert answer.error and not answer.creds, body
    await placement.nc.close()


async def test_a_minted_agent_speaks_only_for_its_own_node(server, tmp_path):
    node_id = unique("od")
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    async with running_minter(server):
        creds = await credentials.issue(node_id, tmp_path)
    claims = decode_claims(creds.read_text().split("USER JWT-----\n")[1].split("\n")[0])
    assert claims["nats"]["pub"]["allow"] == list(busroles.agent(node_id, secrets=False).publish)
    agent = await Client().open(server, creds, inbox=busroles.inbox(f"agent-{node_id}"))
    await agent.nc.publish(f"tm.node.evt.{node_id}.heartbeat", b"{}")
    assert await agent.settle() == []
    await agent.nc.publish("tm.node.evt.n1.heartbeat", b"{}")
    await agent.nc.subscribe("tm.node.cmd.>")
    # its start identity (in the node's user data, which its tasks can read) asks for no secrets of its tasks
    await agent.nc.publish(f"tm.rpc.submitter.secrets.{node_id}", b"{}")
    await agent.nc.subscribe(f"_INBOX_secrets.{node_id}.>")
    errors = await agent.settle()
    assert any("tm.node.evt.n1.heartbeat" in e for e in errors) and any("tm.node.cmd.>" in e for e in errors)
    assert any(f"tm.rpc.submitter.secrets.{node_id}" in e for e in errors)
    assert any(f"_inbox_secrets.{node_id.lower()}.>" in e for e in errors)
    await agent.nc.close()
    async with running_minter(server):
        await credentials.revoke(node_id, tmp_path)


async def test_no_identity_but_placement_may_ask_the_minter(server):
    async with running_minter(server):
        others = (("agent-n1", agent_creds(server, "n1")), ("monitor", server.identities.creds("monitor")))
        for identity, creds in others:
            client = await Client().open(server, creds, inbox=busroles.inbox(identity))
            with pytest.raises((NatsError, asyncio.TimeoutError)):
                await client.nc.request(MINT_AGENT, b'{"node_id": "od-stolen"}', timeout=1)
            assert any(MINT_AGENT in e for e in await client.settle())
            await client.nc.close()


async def test_placement_cannot_have_a_static_nodes_or_a_services_identity_revoked(server):
    """A revocation revokes what the minter minted for that node, and nothing else."""
    agent = await as_agent(server, "n1")
    placement = await Client().open(server, server.identities.creds("placement"), inbox=busroles.inbox("placement"))
    async with running_minter(server):
        for node_id in ("n1", "monitor", "placement"):
            assert (await ask(placement, REVOKE_NODE, RevokeNode(node_id=node_id).model_dump())).error == ""
    await agent.nc.flush(timeout=2)  # the account update is in force before the minter answers
    assert not agent.closed.is_set() and await agent.settle() == []
    again = await nats.connect(server.nats_url, user_credentials=str(server.identities.creds("placement")))
    await again.close()
    await agent.nc.close()
    await placement.nc.close()


async def test_a_request_whose_answer_would_go_elsewhere_than_an_inbox_mints_nothing(server):
    """The answer carries an identity's seed: a request naming a platform subject (or another identity's inbox) as
    its reply subject is dropped before anything is minted."""
    placement = await Client().open(server, server.identities.creds("placement"), inbox=busroles.inbox("placement"))
    aimed, honest = unique("od"), unique("od")
    async with running_minter(server):
        for reply in ("tm.job.status.Completed.Completed", f"{busroles.inbox('agent-n1')}.x"):
            await placement.nc.publish(MINT_AGENT, json.dumps({"node_id": aimed}).encode(), reply=reply)
        assert (await ask(placement, MINT_AGENT, {"node_id": honest})).creds  # answered after the two before it
    minted = server.identities.minter().minted
    assert honest in minted and aimed not in minted
    await placement.nc.close()


async def test_placement_waits_for_a_minter_that_is_not_listening_yet(server, tmp_path):
    """A minter starting (or started again by the stack) is asked again, not a failed rental."""
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    node_id = unique("od")
    issuing = asyncio.create_task(credentials.issue(node_id, tmp_path))
    await asyncio.sleep(0.5)  # its first requests find no one
    assert not issuing.done()
    async with running_minter(server):
        creds = await issuing
        assert decode_claims(creds.read_text().split("USER JWT-----\n")[1].split("\n")[0])["name"] == f"agent-{node_id}"
        await credentials.revoke(node_id, tmp_path)


@pytest.fixture
def own_servers(tmp_path):
    (tmp_path / "stack").mkdir()
    with real_servers(tmp_path / "stack", cluster=CLUSTER) as stack:
        yield stack


async def test_a_data_dir_whose_placement_held_the_signing_keys_restarts_with_keys_it_never_held(own_servers, tmp_path):
    """An older data dir: `bus/placement/minter.json` held the account's and the operator's signing keys. The stack
    moves it to the minter and replaces both keys; what they signed (a user a compromised placement minted itself
    before) is refused, the stream data and the rented nodes' revocation are kept."""
    stack = own_servers
    credentials = NodeCredentials(creds=stack.identities.creds("placement"), nats_url=stack.nats_url)
    async with running_minter(stack):
        rented = await credentials.issue("od-kept", tmp_path)
    own = mint_user(
        name="placements-own",
        account=public_key(stack.identities.keys()["account"]),
        signer_seed=stack.identities.minter().account_signer_seed,
        permissions=busroles.admin(),
    )[1]
    (tmp_path / "own.creds").write_text(own)
    command = await command_for(stack, "n1")
    for name in stack.nats_servers:
        stack.stop(name)
    old = stack.identities.placement_minter_file  # the data dir as the version before this one left it
    old.parent.mkdir(mode=0o700)
    before = json.loads(stack.identities.minter_file.read_text())
    for field in ("minted", "minted_at", "retired", "rented_from", "rental_signers", "signed_by", "machine_of"):
        before.pop(field)  # no such fields then (a rented node's identity was signed by the account's signing key)
    old.write_text(json.dumps(before))
    stack.identities.minter_file.unlink()
    stack.identities.minter_file.parent.rmdir()
    (stack.data_dir / "provisioned").mkdir(mode=0o700)
    (tmp_path / "od-kept.user").replace(stack.data_dir / "provisioned" / "od-kept.user")

    stack.start_nats()
    assert not old.exists() and stack.identities.minter().minted == {"od-kept": [public_key_of(rented)]}
    for refused in (tmp_path / "own.creds", rented):
        with pytest.raises(NatsError, match="Authorization Violation"):
            await nats.connect(stack.nats_url, user_credentials=str(refused), allow_reconnect=False)
    operator = await Client().open(stack, stack.admin_creds(), inbox=busroles.inbox(busroles.OPERATOR))
    kept = await operator.nc.jetstream(timeout=5).get_last_msg("TM_NODE_CMD", "tm.node.cmd.n1.>")
    assert command.job_id.encode() in kept.data
    await operator.nc.close()
    credentials = NodeCredentials(creds=stack.identities.creds("placement"), nats_url=stack.nats_url)  # as minted
    async with running_minter(stack):  # at every start
        fresh = await credentials.issue(unique("od"), tmp_path)
        agent = await Client().open(stack, fresh)
        await agent.nc.close()
        await credentials.revoke("od-kept", stack.data_dir / "provisioned")  # pushed, with the new operator key


def public_key_of(creds: Path) -> str:
    return decode_claims(creds.read_text().split("USER JWT-----\n")[1].split("\n")[0])["sub"]


def live_rented(server: Stack) -> int:
    return sum(1 for users in server.identities.minter().minted.values() if users)


async def test_a_live_rented_node_gets_no_second_identity_nor_one_after_its_revocation(server, tmp_path):
    """A second `MintAgent` for a rented node was granted: a user with the same permissions, reading that node's
    command stream (job secrets included) beside its agent; and after a revocation, in its place."""
    node_id = unique("od")
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    placement = await Client().open(server, server.identities.creds("placement"), inbox=busroles.inbox("placement"))
    async with running_minter(server):
        await credentials.issue(node_id, tmp_path)
        first = server.identities.minter().minted[node_id]
        second = await ask(placement, MINT_AGENT, {"node_id": node_id})
        assert "one per node" in second.error and not second.creds
        assert server.identities.minter().minted[node_id] == first and len(first) == 1
        await credentials.revoke(node_id, tmp_path)
        again = await ask(placement, MINT_AGENT, {"node_id": node_id})
        assert "never another" in again.error and not again.creds
    assert node_id not in server.identities.minter().minted
    await placement.nc.close()


async def test_invented_nodes_past_the_cap_or_the_rate_get_no_identity_and_the_refusal_names_the_limit(server):
    """A compromised placement minted an identity for any number of invented node ids, as fast as it asked."""
    placement = await Client().open(server, server.identities.creds("placement"), inbox=busroles.inbox("placement"))
    invented = [unique("od") for _ in range(3)]
    async with running_minter(server, max_rented_nodes=live_rented(server) + 2):
        answers = [await ask(placement, MINT_AGENT, {"node_id": node_id}) for node_id in invented]
        assert [bool(a.creds) for a in answers] == [True, True, False]
        assert "TRAINMASTER_MAX_RENTED_NODES" in answers[2].error
        for node_id in invented:
            await ask(placement, REVOKE_NODE, {"node_id": node_id})
    invented = [unique("od") for _ in range(3)]
    async with running_minter(server, mint_burst=2, mints_per_minute=0.01):
        answers = [await ask(placement, MINT_AGENT, {"node_id": node_id}) for node_id in invented]
        assert [bool(a.creds) for a in answers] == [True, True, False]
        assert "rate limit: at most 2 mints at once" in answers[2].error
        for node_id in invented:
            await ask(placement, REVOKE_NODE, {"node_id": node_id})
    assert not set(invented) & set(server.identities.minter().minted)
    await placement.nc.close()


async def test_an_identity_whose_answer_was_lost_is_revoked_at_the_release(server, tmp_path, monkeypatch):
    """Placement learnt a node's identity only from the minter's answer: one minted but never answered (a timeout)
    stayed live, and counted against the cap, forever."""
    node_id = unique("od")
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    answered = NodeCredentials.ask

    async def lost(self, subject, request):
        await answered(self, subject, request)
        raise TimeoutError("the answer was lost")

    async with running_minter(server):
        monkeypatch.setattr(NodeCredentials, "ask", lost)
        with pytest.raises(TimeoutError):
            await credentials.issue(node_id, tmp_path)
        monkeypatch.setattr(NodeCredentials, "ask", answered)
        assert node_id in server.identities.minter().minted
        await credentials.revoke(node_id, tmp_path)  # what the failed rental's release does
    assert node_id not in server.identities.minter().minted


KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}  # moto takes any
SHORT_PATIENCE = {"launch_patience_s": 0.5}  # moto and kmock list a machine at once: a refusal need not wait 6 s


@pytest.fixture(scope="module")
def ec2(tmp_path_factory):
    """moto's EC2 on 127.0.0.1, and a cluster file (the stack's nodes) whose [providers.ec2] names it."""
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    url = loopback_only(f"http://127.0.0.1:{server.get_host_and_port()[1]}")
    client = boto3.client("ec2", region_name="us-east-1", endpoint_url=url, **KEYS)
    cluster = f"c{uuid.uuid4().hex[:8]}"
    path = tmp_path_factory.mktemp("ec2") / "cluster.toml"
    path.write_text(
        f'{CLUSTER}\n[providers.ec2]\nregion = "us-east-1"\nendpoint_url = "{url}"\ncluster_name = "{cluster}"\n'
    )
    yield SimpleNamespace(client=client, cluster=cluster, cluster_file=path)
    server.stop()


def launch(ec2, node_id: str, *, cluster: str | None = None) -> str:
    """An instance as placement's EC2 provider launches one: tagged with the cluster and the node."""
    image = ec2.client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    tags = {"trainmaster:cluster": cluster or ec2.cluster, "trainmaster:node-id": node_id}
    reply = ec2.client.run_instances(
        ImageId=image,
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
    )
    return reply["Instances"][0]["InstanceId"]


async def test_where_the_cluster_rents_from_ec2_only_a_launched_instance_keeps_its_identity(server, ec2, tmp_path):
    """The minter believed any node id: an identity for an invented node (or another cluster's instance) lived on
    and got its command consumer. It asks EC2 itself (its own keys): no consumer maker for a node no pending or
    running instance of the cluster carries, and after the grace its identity is revoked (the server then refuses
    it); a launched node keeps its own until its instance is gone."""
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    invented, elsewhere, launched = unique("od"), unique("od"), unique("od")
    launch(ec2, elsewhere, cluster="another")
    settings = {"cluster_file": ec2.cluster_file, "launch_grace_s": 0, "ec2_access_key_id": "testing", **SHORT_PATIENCE}
    async with running_minter(server, **settings, ec2_secret_access_key="testing") as minter:
        for node_id in (invented, elsewhere, launched):
            await credentials.issue(node_id, tmp_path, consumer=False)  # before its machine is launched
        for node_id in (invented, elsewhere):
            with pytest.raises(RuntimeError, match="no pending or running instance"):
                await credentials.create_consumer(node_id)
        instance = launch(ec2, launched)
        await credentials.create_consumer(launched)
        swept = await minter.sweep()  # and what other tests left live on this server
        assert {invented, elsewhere} <= set(swept) and launched not in swept
        for node_id in (invented, elsewhere):
            with pytest.raises(NatsError, match="Authorization Violation"):
                await nats.connect(
                    server.nats_url, user_credentials=str(tmp_path / f"{node_id}.creds"), allow_reconnect=False
                )
        agent = await Client().open(server, tmp_path / f"{launched}.creds")
        await agent.nc.close()
        ec2.client.terminate_instances(InstanceIds=[instance])
        assert await minter.sweep() == [launched]  # nothing else is live by now
    assert not {invented, elsewhere, launched} & set(server.identities.minter().minted)


@pytest_asyncio.fixture(scope="module")
async def k8s(tmp_path_factory, ec2):
    """kmock's Kubernetes API on 127.0.0.1, and two cluster files (the stack's nodes): one whose
    [providers.kubernetes] names it, one that rents from it and from EC2 (moto's)."""
    pytest.importorskip("kmock")
    from tests.integration.kube import Served

    async with Served() as api:
        cluster = f"c{uuid.uuid4().hex[:8]}"
        section = f'[providers.kubernetes]\napi_url = "{api.url}"\nnamespace = "tm"\ncluster_name = "{cluster}"\n'
        folder = tmp_path_factory.mktemp("k8s")
        (folder / "pods.toml").write_text(f"{CLUSTER}\n{section}")
        both = ec2.cluster_file.read_text().replace(f'cluster_name = "{ec2.cluster}"', f'cluster_name = "{cluster}"')
        (folder / "both.toml").write_text(f"{both}{section}")
        yield SimpleNamespace(url=api.url, cluster=cluster, pods=folder / "pods.toml", both=folder / "both.toml")


async def create_pod(k8s, node_id: str, *, cluster: str | None = None, name: str | None = None) -> str:
    """A node's Pod as placement's Kubernetes provider creates one (the API server makes it Pending)."""
    labels = {LABEL_CLUSTER: cluster or k8s.cluster, LABEL_NODE: node_id}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name or pod_name(node_id), "labels": labels}}
    async with httpx.AsyncClient(base_url=k8s.url) as api:
        (await api.post("/api/v1/namespaces/tm/pods", json=body)).raise_for_status()
    return body["metadata"]["name"]


async def end_pod(k8s, name: str, phase: str) -> None:
    async with httpx.AsyncClient(base_url=k8s.url) as api:
        reply = await api.patch(
            f"/api/v1/namespaces/tm/pods/{name}/status",
            json={"status": {"phase": phase}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        reply.raise_for_status()


def refused_by_server(server: Stack, creds: Path):
    return nats.connect(server.nats_url, user_credentials=str(creds), allow_reconnect=False)


async def test_where_the_cluster_rents_pods_only_a_pending_or_running_pod_keeps_its_identity(server, k8s, tmp_path):
    """The minter asked Kubernetes nothing: an invented node id kept its identity and got its command consumer. It
    asks the API with credentials of its own: no consumer maker for a node whose own Pod of the cluster (its label
    and name) is not pending or running, and after the grace its identity is revoked; a launched node keeps its own
    until its Pod ends."""
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    invented, elsewhere, misnamed, launched = (unique("od") for _ in range(4))
    await create_pod(k8s, elsewhere, cluster="another")
    await create_pod(k8s, misnamed, name=f"x-{uuid.uuid4().hex[:6]}")  # labelled with its id, not its Pod
    async with running_minter(server, cluster_file=k8s.pods, launch_grace_s=0, **SHORT_PATIENCE) as minter:
        try:
            for node_id in (invented, elsewhere, misnamed, launched):
                await credentials.issue(node_id, tmp_path, consumer=False, provider="kubernetes")
            for node_id in (invented, elsewhere, misnamed):
                with pytest.raises(RuntimeError, match="no pending or running Pod"):
                    await credentials.create_consumer(node_id)
            pod = await create_pod(k8s, launched)
            await credentials.create_consumer(launched)
            swept = await minter.sweep()
            assert {invented, elsewhere, misnamed} <= set(swept) and launched not in swept
            for node_id in (invented, elsewhere, misnamed):
                with pytest.raises(NatsError, match="Authorization Violation"):
                    await refused_by_server(server, tmp_path / f"{node_id}.creds")
            agent = await Client().open(server, tmp_path / f"{launched}.creds")
            await agent.nc.close()
            await end_pod(k8s, pod, "Succeeded")
            assert await minter.sweep() == [launched]
        finally:
            for node_id in (invented, elsewhere, misnamed, launched):
                await credentials.revoke(node_id, tmp_path)
    assert not {invented, elsewhere, misnamed, launched} & set(server.identities.minter().minted)


async def test_with_both_providers_each_node_is_checked_against_the_one_that_rented_it(server, ec2, k8s, tmp_path):
    """Never "either says yes": an EC2 node whose id a Pod of the cluster carries (anyone who may create Pods may
    label one) gets no consumer maker and is revoked, and so is a Pod's node whose id an EC2 instance tags."""
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    on_ec2, on_k8s, real_ec2, real_pod = (unique("od") for _ in range(4))
    settings = {"cluster_file": k8s.both, "launch_grace_s": 0, "ec2_access_key_id": "testing", **SHORT_PATIENCE}
    async with running_minter(server, **settings, ec2_secret_access_key="testing") as minter:
        try:
            for node_id, provider in (
                (on_ec2, "ec2"),
                (on_k8s, "kubernetes"),
                (real_ec2, "ec2"),
                (real_pod, "kubernetes"),
            ):
                await credentials.issue(node_id, tmp_path, consumer=False, provider=provider)
            await create_pod(k8s, on_ec2)
            launch(ec2, on_k8s, cluster=k8s.cluster)
            launch(ec2, real_ec2, cluster=k8s.cluster)
            await create_pod(k8s, real_pod)
            for node_id, machine in ((on_ec2, "instance"), (on_k8s, "Pod")):
                with pytest.raises(RuntimeError, match=f"no pending or running {machine}"):
                    await credentials.create_consumer(node_id)
            for node_id in (real_ec2, real_pod):
                await credentials.create_consumer(node_id)
            swept = await minter.sweep()
            assert {on_ec2, on_k8s} <= set(swept) and not {real_ec2, real_pod} & set(swept)
            with pytest.raises(RuntimeError, match="checked against the provider that rented it"):
                await credentials.issue(unique("od"), tmp_path, provider=None)  # which one?
        finally:
            for node_id in (on_ec2, on_k8s, real_ec2, real_pod):
                await credentials.revoke(node_id, tmp_path)
    assert not {on_ec2, on_k8s, real_ec2, real_pod} & set(server.identities.minter().minted)


async def test_a_rental_signer_whose_agents_are_all_revoked_leaves_the_account_and_they_stay_refused(server, tmp_path):
    """Revocations were never pruned (agent identities carry no expiry): past TRAINMASTER_MAX_REVOCATIONS nothing
    was minted. An older rental signer whose agents are all revoked leaves the account with their revocations; the
    server still refuses those agents (it trusts no user the key signed), and the newer signer's agent connects."""
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    nodes = [unique("od") for _ in range(3)]
    async with running_minter(server, rented_per_signer=1):
        issued = {}
        for node_id in nodes:  # each signed by a new signer, which the server trusts before the agent is answered
            kept = tmp_path / f"{node_id}.kept"
            kept.write_text((await credentials.issue(node_id, tmp_path)).read_text())
            issued[node_id] = kept
        users = {node_id: public_key_of(creds) for node_id, creds in issued.items()}
        for node_id in nodes[:2]:
            await credentials.revoke(node_id, tmp_path)
        carried = decode_claims(server.identities.minter().account_jwt())["nats"]
        assert not {users[n] for n in nodes[:2]} & set(carried.get("revocations", {}))
        for node_id in nodes[:2]:
            with pytest.raises(NatsError, match="Authorization Violation"):
                await refused_by_server(server, issued[node_id])
        agent = await Client().open(server, issued[nodes[2]])
        await agent.nc.close()
        await credentials.revoke(nodes[2], tmp_path)


async def test_a_pod_made_under_a_deleted_nodes_name_and_labels_neither_gets_its_consumer_maker_nor_keeps_it(
    server, k8s, tmp_path
):
    """Anyone who may create Pods in the namespace could revive a node: its Pod deleted, a new one named tm-<node>
    with its labels passed every later check and the sweep. The node is pinned to its first Pod's uid."""
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    node_id = unique("od")
    async with running_minter(server, cluster_file=k8s.pods, launch_grace_s=0, **SHORT_PATIENCE) as minter:
        try:
            await credentials.issue(node_id, tmp_path, consumer=False, provider="kubernetes")
            name = await create_pod(k8s, node_id)
            await credentials.create_consumer(node_id)
            assert await minter.sweep() == []
            async with httpx.AsyncClient(base_url=k8s.url) as api:
                (await api.delete(f"/api/v1/namespaces/tm/pods/{name}")).raise_for_status()
            await create_pod(k8s, node_id)  # another's, under the same name and labels
            with pytest.raises(RuntimeError, match="pinned at its first check, is gone"):
                await credentials.create_consumer(node_id)
            assert await minter.sweep() == [node_id]
            with pytest.raises(NatsError, match="Authorization Violation"):
                await refused_by_server(server, tmp_path / f"{node_id}.creds")
        finally:
            await credentials.revoke(node_id, tmp_path)


async def test_an_instance_tagged_with_a_released_nodes_id_after_its_own_terminated_keeps_nothing_alive(
    server, ec2, tmp_path
):
    """Anyone who may launch tagged instances could revive a node whose instance terminated; the node is pinned to
    its first instance's id."""
    credentials = NodeCredentials(creds=server.identities.creds("placement"), nats_url=server.nats_url)
    node_id, instances = unique("od"), []
    settings = {"cluster_file": ec2.cluster_file, "launch_grace_s": 0, "ec2_access_key_id": "testing", **SHORT_PATIENCE}
    async with running_minter(server, **settings, ec2_secret_access_key="testing") as minter:
        try:
            await credentials.issue(node_id, tmp_path, consumer=False)
            instances.append(first := launch(ec2, node_id))
            await credentials.create_consumer(node_id)
            instances.append(launch(ec2, node_id))  # two at once: the pinned one counts
            await credentials.create_consumer(node_id)
            assert await minter.sweep() == []
            ec2.client.terminate_instances(InstanceIds=[first])
            with pytest.raises(RuntimeError, match=f"its own, {first}, pinned at its first check, is gone"):
                await credentials.create_consumer(node_id)
            assert await minter.sweep() == [node_id]
            with pytest.raises(NatsError, match="Authorization Violation"):
                await refused_by_server(server, tmp_path / f"{node_id}.creds")
        finally:
            ec2.client.terminate_instances(InstanceIds=instances)
            await credentials.revoke(node_id, tmp_path)
