"""The agent fetches a job's http(s) code and inputs through the egress policy, again at fetch time: a URL that
passed submission but now resolves to the loopback (DNS rebinding), a redirect to an internal address, and a
loopback URL the submitter never saw are refused before any request reaches them."""

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from shared.egress import Policy
from shared.events import StartTask, TaskExited
from shared.jobs import Algorithm
from shared.storage import StoragePolicy, refused_addresses
from services.agent.agent import Agent
from services.agent.checkpoints import CheckpointStore, Mirror
from services.agent.downloads import Downloads, file_name
from services.agent.preparation import PrepareError, Preparer
from tests.factories import node, spec
from tests.unit.addresses import resolver


class Files(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        Files.hits.append(self.path)
        if self.path.startswith("/moved"):
            self.send_response(302)
            self.send_header("Location", f"http://evil.example.test:{self.server.server_port}/internal")
            self.end_headers()
            return
        body = b"secret of the platform" if self.path == "/healthz" else b"dataset bytes"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Files.hits = []
    yield server.server_port
    server.shutdown()
    server.server_close()


def inputs(url: str) -> Algorithm:
    return Algorithm(command="true", inputs=[{"name": "data", "url": url}])


def start(url: str, job_id: str = "j1") -> StartTask:
    return StartTask(
        event_id=f"{job_id}:1:0:start",
        node_id="n1",
        job_id=job_id,
        attempt=1,
        project_id="vision",
        user_name="alice",
        algorithm=inputs(url),
        spec=spec(),
    )


async def fetch(preparer: Preparer, url: str, tmp_path) -> None:
    await preparer.prepare(start(url), tmp_path / "work", {}, lambda text: None)


async def test_a_loopback_input_is_refused_before_any_request(port, tmp_path):
    with pytest.raises(PrepareError, match="127.0.0.1 is a loopback address"):
        await fetch(Preparer(tmp_path / "engines", {}), f"http://127.0.0.1:{port}/healthz", tmp_path)
    assert Files.hits == [] and not (tmp_path / "work" / "inputs" / "data" / "healthz").exists()


async def test_a_name_that_rebinds_to_the_loopback_after_submission_is_refused_at_fetch(port, tmp_path):
    resolve = resolver({"rebind.example.test": [["93.184.216.34"], ["127.0.0.1"]]})
    url = f"http://rebind.example.test:{port}/healthz"
    storage = StoragePolicy(storage_root=f"file://{tmp_path}/s", checkpoint_root=f"file://{tmp_path}/c")
    assert await refused_addresses(inputs(url), policy=storage, resolve=resolve) == []  # what submission saw
    preparer = Preparer(tmp_path / "engines", {}, downloads=Downloads(resolve=resolve))
    with pytest.raises(PrepareError, match="rebind.example.test resolves to a loopback address"):
        await fetch(preparer, url, tmp_path)
    assert Files.hits == []


async def test_an_allowed_host_is_fetched_without_proxies_and_a_redirect_to_a_refused_one_is_not(
    port, tmp_path, monkeypatch
):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # followed, every fetch would fail
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    resolve = resolver({"data.example.test": ["127.0.0.1"], "evil.example.test": ["127.0.0.1"]})
    preparer = Preparer(
        tmp_path / "engines", {}, downloads=Downloads(policy=Policy.parse(["data.example.test"]), resolve=resolve)
    )
    await fetch(preparer, f"http://data.example.test:{port}/train.csv", tmp_path)
    assert (tmp_path / "work" / "inputs" / "data" / "train.csv").read_bytes() == b"dataset bytes"
    with pytest.raises(PrepareError, match="evil.example.test resolves to a loopback address"):
        await fetch(preparer, f"http://data.example.test:{port}/moved", tmp_path)
    assert Files.hits == ["/train.csv", "/moved"]  # never /internal
    assert sorted(p.name for p in (tmp_path / "work" / "inputs" / "data").iterdir()) == ["train.csv"]


async def test_the_agent_ends_the_attempt_start_failed_with_the_reason(port, tmp_path):
    sent: list = []

    async def publish(message) -> None:
        sent.append(message)

    resolve = resolver({"rebind.example.test": [["93.184.216.34"], ["127.0.0.1"]]})
    storage = StoragePolicy(storage_root=f"file://{tmp_path}/s", checkpoint_root=f"file://{tmp_path}/c")
    agent = Agent(
        node=node(node_id="n1"),
        root=tmp_path / "agent",
        publish=publish,
        storage=storage,
        checkpoints=CheckpointStore(storage.checkpoint_root),
        preparer=Preparer(tmp_path / "engines", {}, downloads=Downloads(resolve=resolve)),
    )
    url = f"http://rebind.example.test:{port}/healthz"
    assert await refused_addresses(inputs(url), policy=storage, resolve=resolve) == []  # passed submission
    await agent.start(start(url))
    for _ in range(200):
        if exits := [m for m in sent if isinstance(m, TaskExited)]:
            break
        await asyncio.sleep(0.05)
    [exited] = exits
    assert exited.reason == "start_failed" and "resolves to a loopback address" in exited.message
    assert Files.hits == []


def test_http_is_never_mirrored_through_fsspec():
    for url in ("http://127.0.0.1/x", "HTTPS://example.com/x"):
        with pytest.raises(ValueError, match="egress policy"):
            Mirror(url)


def test_a_download_is_saved_under_a_safe_name():
    assert file_name("https://h/a/train%20set.csv?x=1") == "train set.csv"
    for url in ("https://h/", "https://h", "https://h/a/..", "https://h/%2e%2e", "https://h/a%2fb", "https://h/.env"):
        assert file_name(url) == "download", url
