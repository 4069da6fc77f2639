"""The agent's copies to an object store (what docker compose runs: MinIO), through s3fs against moto's S3 server:
a checkpoint synced and restored on another node, what a copy cut short left removed, nothing left under a
copy's own name. Until 2026-11-30 no test took this path (s3fs was not installed beside boto3)."""

import logging
import os
from pathlib import Path

import boto3
import fsspec
import pytest
import s3fs  # noqa: F401 (the test extra installs it: a broken install fails here, never skips)
from moto import server as moto_server

from services.agent import checkpoints
from services.agent.checkpoints import UPLOADING, CheckpointStore, Mirror, writing_name
from tests.integration.clouds import FAKE_AWS, loopback_only

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
BUCKET = "trainmaster"


@pytest.fixture
def s3(monkeypatch):
    for key, value in FAKE_AWS.items():
        monkeypatch.setenv(key, value)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    url = loopback_only(f"http://127.0.0.1:{server.get_host_and_port()[1]}")
    boto3.client("s3", region_name="us-east-1", endpoint_url=url).create_bucket(Bucket=BUCKET)
    # as compose configures the agents (FSSPEC_S3_ENDPOINT_URL), read by fsspec when it builds a file system
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": url, "skip_instance_cache": True})
    try:
        yield fsspec.filesystem("s3")
    finally:
        server.stop()


def test_a_checkpoint_is_synced_to_the_bucket_and_restored_on_another_node(s3, tmp_path):
    store = CheckpointStore(f"s3://{BUCKET}/checkpoints")
    local = tmp_path / "node-a" / "checkpoint"
    (local / "opt").mkdir(parents=True)
    (local / "model.pt").write_bytes(b"w" * 3000)
    (local / "opt" / "state.pt").write_bytes(b"s" * 10)
    manifest = store.sync("vision", "job-1", local, {}, tmp_path / "node-a")
    assert sorted(manifest) == ["model.pt", "opt/state.pt"]
    assert sorted(s3.find(f"{BUCKET}/checkpoints/vision/job-1")) == [
        f"{BUCKET}/checkpoints/vision/job-1/model.pt",
        f"{BUCKET}/checkpoints/vision/job-1/opt/state.pt",
    ]  # nothing under a copy's own name
    (local / "opt" / "state.pt").unlink()
    store.sync("vision", "job-1", local, manifest, tmp_path / "node-a")  # a deletion reaches the bucket
    back = tmp_path / "node-b" / "checkpoint"
    assert sorted(store.restore("vision", "job-1", back)) == ["model.pt"]
    assert (back / "model.pt").read_bytes() == b"w" * 3000


def test_what_a_copy_cut_short_left_in_the_bucket_is_removed_by_its_restore_once_old_enough(s3, tmp_path, monkeypatch):
    prefix = f"{BUCKET}/checkpoints/vision/job-2"
    s3.pipe(f"{prefix}/model.pt", b"saved")
    s3.pipe(f"{prefix}/{writing_name('model.pt')}", b"cut sho")
    s3.pipe(f"{prefix}/notes{UPLOADING}", b"the task's own")
    store = CheckpointStore(f"s3://{BUCKET}/checkpoints")
    assert sorted(store.restore("vision", "job-2", tmp_path / "a")) == ["model.pt", f"notes{UPLOADING}"]
    assert len(s3.find(prefix)) == 3  # written just now (the bucket's own LastModified): a copy may rename it yet
    monkeypatch.setattr(checkpoints, "LEFTOVER_S", 0.0)
    store.restore("vision", "job-2", tmp_path / "b")
    assert sorted(os.path.basename(p) for p in s3.find(prefix)) == ["model.pt", f"notes{UPLOADING}"]


def test_an_output_is_uploaded_beside_what_earlier_attempts_left(s3, tmp_path):
    out = tmp_path / "outputs" / "o"
    out.mkdir(parents=True)
    (out / "metrics.json").write_text("{}")
    s3.pipe(f"{BUCKET}/storage/vision/runs/earlier.txt", b"kept")
    Mirror(f"s3://{BUCKET}/storage/vision/runs").sync(out, {}, delete=False, anchor=tmp_path)
    assert sorted(Path(p).name for p in s3.find(f"{BUCKET}/storage/vision/runs")) == ["earlier.txt", "metrics.json"]
