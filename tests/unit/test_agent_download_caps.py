"""A hostile URL cannot fill the node's disk: every download a task makes (code_dir, inputs over http(s) or fsspec,
its restored checkpoint) stops at a cap per download and one per task, whatever the server announces; the partial
file goes and the task fails naming the field."""

import asyncio
import gzip
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from shared.egress import Policy
from shared.events import StartTask, TaskExited
from shared.jobs import Algorithm
from shared.storage import StoragePolicy
from services.agent.agent import Agent
from services.agent.checkpoints import CheckpointStore, Mirror
from services.agent.downloads import Downloads
from services.agent.preparation import PrepareError, Preparer
from services.agent.sizecap import GB, Tally, TooLarge
from tests.factories import node, spec
from tests.unit.addresses import resolver

MB = 2**20
CAP = MB  # per download in these tests
SENT = 8 * MB  # what a hostile server sends


# Compressed although the agent asks for none: one layer, and two stacked (decoded, a network read expands ~10^6 times).
BOMBS = {"/bomb.bin": gzip.compress(b"\0" * SENT), "/stacked.bin": gzip.compress(gzip.compress(b"\0" * SENT))}
ENCODINGS = {"/bomb.bin": "gzip", "/stacked.bin": "gzip, gzip"}
ASKED: list[str | None] = []  # the Accept-Encoding of each request for a bomb


class Hostile(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        try:
            self._answer()
        except (BrokenPipeError, ConnectionResetError):  # the agent hung up at its cap
            pass

    def _answer(self):
        if self.path == "/honest.bin":  # says how large it is
            self._send(b"x" * SENT, length=SENT)
        elif self.path == "/endless.bin":  # says nothing, streams until it closes
            self.protocol_version = "HTTP/1.0"
            self._send(b"x" * SENT, length=None)
        elif self.path in BOMBS:  # a small, true Content-Length of a body that would expand past the cap
            ASKED.append(self.headers.get("Accept-Encoding"))
            self._send(
                BOMBS[self.path], length=len(BOMBS[self.path]), headers={"Content-Encoding": ENCODINGS[self.path]}
            )
        else:  # /part-N.bin: under the cap per download
            self._send(b"y" * (CAP * 6 // 10), length=CAP * 6 // 10)

    def _send(self, body: bytes, *, length: int | None, headers: dict | None = None):
        self.send_response(200)
        if length is not None:
            self.send_header("Content-Length", str(length))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        for start in range(0, len(body), 64 * 1024):
            self.wfile.write(body[start : start + 64 * 1024])

    def log_message(self, *args):
        pass


@pytest.fixture
def port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()
    server.server_close()


def capped(tmp_path, *, per_task: int | None = None) -> Preparer:
    downloads = Downloads(
        policy=Policy.parse(["data.example.test"]), resolve=resolver({"data.example.test": ["127.0.0.1"]})
    )
    return Preparer(
        tmp_path / "engines", {}, downloads=downloads, caps=partial(Tally, per_download=CAP, per_task=per_task)
    )


def start(*urls: str) -> StartTask:
    return StartTask(
        event_id="j1:1:0:start",
        node_id="n1",
        job_id="j1",
        attempt=1,
        project_id="vision",
        user_name="alice",
        algorithm=Algorithm(command="true", inputs=[{"name": f"d{i}", "url": url} for i, url in enumerate(urls)]),
        spec=spec(),
    )


async def prepare(preparer: Preparer, *urls: str, tmp_path) -> None:
    await preparer.prepare(start(*urls), tmp_path / "work", {}, lambda text: None)


@pytest.mark.parametrize("path", ["/bomb.bin", "/stacked.bin"])
async def test_a_compressed_body_is_saved_as_sent_and_never_expanded(port, tmp_path, path):
    ASKED.clear()
    url = f"http://data.example.test:{port}{path}"
    await prepare(capped(tmp_path), url, tmp_path=tmp_path)
    assert ASKED == ["identity"]
    assert (tmp_path / "work" / "inputs" / "d0" / path[1:]).read_bytes() == BOMBS[path]


@pytest.mark.parametrize("path", ["/honest.bin", "/endless.bin"])
async def test_a_download_past_its_cap_stops_and_leaves_no_file(port, tmp_path, path):
    url = f"http://data.example.test:{port}{path}"
    with pytest.raises(PrepareError) as refused:
        await prepare(capped(tmp_path), url, tmp_path=tmp_path)
    assert str(refused.value) == f"inputs.d0: cannot fetch {url}: larger than the 1,048,576 bytes one download may be"
    assert not (tmp_path / "work" / "inputs" / "d0").exists()


async def test_a_task_s_downloads_together_stop_at_the_task_cap(port, tmp_path):
    first, second = (f"http://data.example.test:{port}/part-{i}.bin" for i in (1, 2))
    with pytest.raises(PrepareError, match="inputs.d1: .* the task's downloads pass the 1,048,576 bytes"):
        await prepare(capped(tmp_path, per_task=CAP), first, second, tmp_path=tmp_path)
    assert (tmp_path / "work" / "inputs" / "d0" / "part-1.bin").stat().st_size == CAP * 6 // 10
    assert not (tmp_path / "work" / "inputs" / "d1").exists()


async def test_an_fsspec_input_past_the_cap_is_refused_by_its_listing(tmp_path):
    source = tmp_path / "storage" / "vision" / "data"
    source.mkdir(parents=True)
    for name in ("a.bin", "b.bin"):
        (source / name).write_bytes(b"z" * (CAP * 6 // 10))
    with pytest.raises(PrepareError, match="larger than the 1,048,576 bytes one download may be"):
        await prepare(capped(tmp_path), f"file://{source}", tmp_path=tmp_path)
    assert not (tmp_path / "work" / "inputs" / "d0").exists()


def test_a_single_fsspec_file_past_the_cap_is_refused(tmp_path):
    (tmp_path / "huge.bin").write_bytes(b"z" * (2 * CAP))
    with pytest.raises(TooLarge, match="one download may be"):
        Mirror(f"file://{tmp_path}/huge.bin").restore(tmp_path / "local", Tally(per_download=CAP))
    assert list((tmp_path / "local").iterdir()) == []


def test_an_fsspec_listing_that_lies_about_sizes_is_still_stopped_by_what_is_copied(tmp_path, monkeypatch):
    source = tmp_path / "bucket"
    source.mkdir()
    (source / "huge.bin").write_bytes(b"z" * (2 * CAP))
    mirror = Mirror(f"file://{source}")
    find = mirror.fs.find
    monkeypatch.setattr(
        mirror.fs, "find", lambda path, **kw: {p: {**info, "size": 1} for p, info in find(path, **kw).items()}
    )
    with pytest.raises(TooLarge, match="one download may be"):
        mirror.restore(tmp_path / "local", Tally(per_download=CAP))
    assert list((tmp_path / "local").iterdir()) == []


def test_a_restored_checkpoint_past_the_cap_is_refused_naming_it(tmp_path):
    saved = tmp_path / "checkpoints" / "vision" / "j1"
    saved.mkdir(parents=True)
    (saved / "model.pt").write_bytes(b"w" * (2 * CAP))
    store = CheckpointStore(f"file://{tmp_path}/checkpoints", max_bytes=CAP)
    with pytest.raises(TooLarge, match=f"checkpoint file://{tmp_path}/checkpoints/vision/j1: larger than"):
        store.restore("vision", "j1", tmp_path / "local")
    assert not (tmp_path / "local" / "model.pt").exists()
    assert CheckpointStore(f"file://{tmp_path}/checkpoints").restore("vision", "j1", tmp_path / "all")  # no cap


def test_caps_come_in_gigabytes_and_zero_means_none():
    assert Tally.of(per_download_gb=0.5, per_task_gb=0) == Tally(per_download=GB // 2, per_task=None)


async def test_the_agent_ends_the_attempt_start_failed_naming_the_field(port, tmp_path):
    sent: list = []

    async def publish(message) -> None:
        sent.append(message)

    storage = StoragePolicy(
        storage_root=f"file://{tmp_path}/s",
        checkpoint_root=f"file://{tmp_path}/c",
        allow_hosts=("data.example.test",),
    )
    agent = Agent(
        node=node(node_id="n1"),
        root=tmp_path / "agent",
        publish=publish,
        storage=storage,
        checkpoints=CheckpointStore(storage.checkpoint_root),
        preparer=capped(tmp_path),
    )
    await agent.start(start(f"http://data.example.test:{port}/endless.bin"))
    for _ in range(200):
        if exits := [m for m in sent if isinstance(m, TaskExited)]:
            break
        await asyncio.sleep(0.05)
    [exited] = exits
    assert exited.reason == "start_failed"
    assert exited.message.startswith("inputs.d0: cannot fetch http://data.example.test:")
    assert "larger than the 1,048,576 bytes one download may be" in exited.message
