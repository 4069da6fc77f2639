"""How the Kubernetes provider finds and authenticates to the API (lightkube): a kubeconfig's contexts (a client
certificate over verified TLS, an exec plugin's token), the pod's service account in the cluster, and what it
refuses. The API server is a small TLS server on 127.0.0.1 that records who called it."""

import asyncio
import base64
import datetime
import ipaddress
import json
import ssl
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.placement.providers.cloud import NodeMaker, offer_infos
from services.placement.providers.kubernetes import KubernetesProvider, KubernetesSettings
from services.placement.providers.wiring import make_providers
from tests.factories import L4_ENTRY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
EXEC_PLUGIN = Path(__file__).parent.parent / "data" / "kube" / "exec_credential.py"
ENTRY = {**L4_ENTRY, "provider": "kubernetes"}


def _cert(name: str, key, *, issuer: tuple | None = None, ca: bool = False, ip: str | None = None):
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_name, signer_key = issuer or (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ip:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False
        )
    return builder.sign(signer_key, hashes.SHA256())


def _pem(obj) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A cluster CA, the API server's certificate (127.0.0.1) and a client certificate for placement."""
    folder = tmp_path_factory.mktemp("pki")
    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _cert("cluster-ca", ca_key, ca=True)
    server = _cert("kube-apiserver", server_key, issuer=(ca.subject, ca_key), ip="127.0.0.1")
    client = _cert("trainmaster-placement", client_key, issuer=(ca.subject, ca_key))
    files = {
        "ca.crt": _pem(ca),
        "server.crt": _pem(server),
        "server.key": _pem(server_key),
        "client.crt": _pem(client),
        "client.key": _pem(client_key),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


class ApiServer:
    """Answers every request with an empty PodList; records each one's Authorization header and client CN."""

    def __init__(self, pki: Path) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.crt"))
        self.context.load_cert_chain(pki / "server.crt", pki / "server.key")
        self.context.verify_mode = ssl.CERT_OPTIONAL  # a client certificate is one way in, a token another
        self.seen: list[dict] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        headers = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line)
        peer = writer.get_extra_info("peercert") or {}
        cn = next((v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"), None)
        self.seen.append(
            {"path": head.split(" ")[1], "auth": headers.get("authorization") or headers.get("Authorization"), "cn": cn}
        )
        body = json.dumps(
            {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": []}
        ).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()


@pytest.fixture
async def api(pki):
    server = ApiServer(pki)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=server.context)
    server.url = f"https://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    yield server
    listener.close()


def kubeconfig(
    tmp_path: Path,
    pki: Path,
    url: str,
    *,
    insecure: bool = False,
    exec_version: str = "client.authentication.k8s.io/v1beta1",
) -> Path:
    """Two contexts: `prod` (the default) with a client certificate, `dev` with an exec plugin's token."""
    b64 = lambda name: base64.b64encode((pki / name).read_bytes()).decode()  # noqa: E731
    cluster = {"server": url, "certificate-authority-data": b64("ca.crt")}
    if insecure:
        cluster = {"server": url, "insecure-skip-tls-verify": True}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "prod",
        "clusters": [{"name": "gpu-cluster", "cluster": cluster}],
        "users": [
            {
                "name": "cert",
                "user": {"client-certificate-data": b64("client.crt"), "client-key-data": b64("client.key")},
            },
            {
                "name": "eks",
                "user": {
                    "exec": {
                        "apiVersion": exec_version,
                        "command": sys.executable,
                        "args": [str(EXEC_PLUGIN), "token-from-the-plugin"],
                    }
                },
            },
        ],
        "contexts": [
            {"name": "prod", "context": {"cluster": "gpu-cluster", "user": "cert"}},
            {"name": "dev", "context": {"cluster": "gpu-cluster", "user": "eks"}},
        ],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def provider(tmp_path: Path, **section) -> KubernetesProvider:
    settings = KubernetesSettings(
        image="registry.local/trainmaster:1", cluster_name="c1", bus_url="nats://bus:4222", **section
    )
    return KubernetesProvider(
        settings=settings, offers=offer_infos([ENTRY]), maker=NodeMaker(boot=settings, folder=tmp_path)
    )


def wired(tmp_path: Path, **section) -> None:
    make_providers(
        entries=[ENTRY],
        sections={"kubernetes": {"image": "i:1", "cluster_name": "c1", **section}},
        default="local-process",
        data_dir=tmp_path,
        broker=None,
        nats_url="nats://bus:4222",
        minter=None,
        ca_file=None,
    )


async def test_the_kubeconfig_current_context_authenticates_with_its_client_certificate(api, pki, tmp_path):
    kube = provider(tmp_path, kubeconfig=kubeconfig(tmp_path, pki, api.url))
    assert await kube._list("pods") == []
    await kube.close()
    assert api.seen == [
        {
            "path": "/api/v1/namespaces/trainmaster/pods?labelSelector=trainmaster.io%2Fcluster%3Dc1",
            "auth": None,
            "cn": "trainmaster-placement",
        }
    ]


async def test_a_named_context_authenticates_with_its_exec_plugins_token(api, pki, tmp_path):
    kube = provider(tmp_path, kubeconfig=kubeconfig(tmp_path, pki, api.url), context="dev")
    await kube._list("pods")
    await kube._list("secrets")
    await kube.close()
    assert [(s["auth"], s["cn"]) for s in api.seen] == [("Bearer token-from-the-plugin", None)] * 2


async def test_in_the_cluster_the_pods_service_account_is_used(api, pki, tmp_path, monkeypatch):
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("service-account-token")
    (account / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    (account / "namespace").write_text("trainmaster")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", api.url.rsplit(":", 1)[1])
    kube = provider(tmp_path, service_account_dir=account)
    await kube._list("pods")
    await kube.close()
    assert [(s["auth"], s["cn"]) for s in api.seen] == [("Bearer service-account-token", None)]


def test_outside_a_pod_without_a_kubeconfig_placement_does_not_start(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SystemExit, match="not running in a Kubernetes pod"):
        wired(tmp_path, service_account_dir=str(tmp_path / "absent"))


def test_a_missing_or_broken_kubeconfig_an_unknown_context_or_one_skipping_tls_is_refused(pki, tmp_path):
    path = kubeconfig(tmp_path, pki, "https://127.0.0.1:6443")
    with pytest.raises(SystemExit, match="Context 'staging' not found"):
        wired(tmp_path, kubeconfig=str(path), context="staging")
    insecure = kubeconfig(tmp_path, pki, "https://127.0.0.1:6443", insecure=True)
    with pytest.raises(SystemExit, match="skips TLS verification"):
        wired(tmp_path, kubeconfig=str(insecure))
    v1 = kubeconfig(tmp_path, pki, "https://127.0.0.1:6443", exec_version="client.authentication.k8s.io/v1")
    with pytest.raises(SystemExit, match="speaks client.authentication.k8s.io/v1;"):
        wired(tmp_path, kubeconfig=str(v1), context="dev")
    with pytest.raises(SystemExit, match="not found"):
        wired(tmp_path, kubeconfig=str(tmp_path / "absent"))
    (tmp_path / "broken").write_text("clusters: [unclosed")
    with pytest.raises(SystemExit, match="Kubernetes API"):
        wired(tmp_path, kubeconfig=str(tmp_path / "broken"))


async def test_the_pod_watch_outlives_an_api_that_answers_nonsense(api, pki, tmp_path, monkeypatch):
    monkeypatch.setattr("services.placement.providers.kubernetes.WATCH_RETRY_S", 0.05)
    kube = provider(tmp_path, kubeconfig=kubeconfig(tmp_path, pki, api.url))
    failed = []
    watch = asyncio.create_task(kube.watch(lambda node_id, reason: failed.append(node_id)))
    try:
        for _ in range(200):  # a list where a watch stream was due: each try fails, the next one follows
            if len([s for s in api.seen if "watch=true" in s["path"]]) >= 3:
                break
            await asyncio.sleep(0.05)
        assert len([s for s in api.seen if "watch=true" in s["path"]]) >= 3
        assert not watch.done() and failed == []
    finally:
        watch.cancel()
        await kube.close()
