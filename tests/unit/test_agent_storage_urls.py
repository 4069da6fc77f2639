"""The storage allow-list: a job reaches its own project's storage and what the operator allows, nothing else."""

import os

import pytest

from shared.cluster import ClusterFileError
from shared.jobs import Algorithm
from shared.storage import DEFAULT_ALLOWED_URLS, StorageError, StoragePolicy, StorageSettings, check_url, refused_urls


@pytest.fixture
def policy(tmp_path) -> StoragePolicy:
    (tmp_path / "storage" / "vision").mkdir(parents=True)
    (tmp_path / "storage" / "nlp").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    return StoragePolicy(
        allowed_urls=(*DEFAULT_ALLOWED_URLS, f"file://{tmp_path}/shared/"),
        storage_root=f"file://{tmp_path}/storage",
        checkpoint_root=f"file://{tmp_path}/ckpt",
    )


def allowed(url: str, policy: StoragePolicy, project: str = "vision") -> bool:
    try:
        check_url(url, policy=policy, project_id=project)
        return True
    except StorageError:
        return False


def test_the_projects_own_storage_and_checkpoints_are_allowed(policy, tmp_path):
    assert allowed(f"file://{tmp_path}/storage/vision/data", policy)
    assert allowed(f"{tmp_path}/storage/vision/data", policy)  # a bare path is a local path
    assert allowed(f"file://{tmp_path}/ckpt/vision/job-1", policy)
    assert allowed(f"file://{tmp_path}/shared/imagenet", policy)


def test_host_paths_and_other_projects_are_refused(policy, tmp_path):
    for url in (
        "file:///etc/passwd",
        "/etc/passwd",
        f"file://{tmp_path}/storage/nlp/model.pt",
        f"file://{tmp_path}/ckpt/nlp/job-1",
        f"file://{tmp_path}/storage/vision-evil/x",
        f"file://{tmp_path}/storage",
        "FILE:///etc/shadow",
        "file://localhost/etc/passwd",
        "relative/path",
    ):
        assert not allowed(url, policy), url


def test_dot_dot_and_links_are_resolved_before_the_prefix_is_compared(policy, tmp_path):
    assert not allowed(f"file://{tmp_path}/storage/vision/../nlp/model.pt", policy)
    assert not allowed(f"file://{tmp_path}/shared/../storage/nlp", policy)
    os.symlink(tmp_path / "storage" / "nlp", tmp_path / "storage" / "vision" / "link")
    assert not allowed(f"file://{tmp_path}/storage/vision/link/model.pt", policy)
    os.symlink("/etc", tmp_path / "shared" / "etc")
    assert not allowed(f"file://{tmp_path}/shared/etc/passwd", policy)


def test_remote_schemes_follow_the_allow_list(policy):
    assert allowed("https://example.com/x.tar", policy) and allowed("HTTP://example.com/x", policy)
    for url in (
        "ftp://host/x",
        "memory://x",
        "simplecache::file:///etc/passwd",
        "s3://b/a::file:///etc/passwd",
        "s3://bucket/../other",
        "https://host/a\x00b",
        "zip://x::s3://b/y",
    ):
        assert not allowed(url, policy), url
    strict = policy.model_copy(update={"allowed_urls": ("s3://team-bucket/",)})
    assert allowed("s3://team-bucket/x", strict) and allowed("S3://team-bucket/x", strict)
    assert not allowed("https://example.com/x", strict)


def test_no_bucket_is_allowed_by_default_but_the_projects_own():
    remote = StoragePolicy(storage_root="s3://tm/storage", checkpoint_root="s3://tm/ckpt")
    assert remote.allowed_urls == DEFAULT_ALLOWED_URLS
    assert allowed("s3://tm/storage/vision/data", remote) and allowed("s3://tm/ckpt/vision/j1", remote)
    for url in (
        "s3://bucket/data",
        "s3://tm/storage/nlp/data",
        "s3://tm/ckpt/nlp/j1",
        "s3://tm/storage/visionx/a",
        "s3://tm/other",
    ):
        assert not allowed(url, remote), url


def test_a_remote_project_root_gives_each_project_its_prefix():
    remote = StoragePolicy(allowed_urls=(), storage_root="s3://tm/storage", checkpoint_root="s3://tm/ckpt")
    assert allowed("s3://tm/storage/vision/out", remote) and not allowed("s3://tm/storage/nlp/out", remote)
    assert remote.checkpoint_url(project_id="vision", job_id="j1") == "s3://tm/ckpt/vision/j1"
    with pytest.raises(StorageError):
        remote.checkpoint_url(project_id="..", job_id="j1")


def test_every_url_of_a_job_is_checked_and_named_by_its_field(policy, tmp_path):
    algorithm = Algorithm(
        command="true",
        code_dir=f"file://{tmp_path}/storage/vision/code",
        inputs=[{"name": "ok", "url": "https://example.com/x"}, {"name": "bad", "url": "file:///etc/passwd"}],
        outputs=[
            {"name": "out", "url": f"file://{tmp_path}/storage/nlp/out"},
            {"name": "post", "url": "https://example.com/upload"},
        ],
    )
    refused = refused_urls(algorithm, policy=policy, project_id="vision")
    assert [field for field, _ in refused] == [
        "algorithm.inputs.1.url",
        "algorithm.outputs.0.url",
        "algorithm.outputs.1.url",
    ]
    assert "outputs cannot be http(s)" in refused[2][1]


def test_the_cluster_file_sets_the_allow_list_and_the_environment_overrides_it(tmp_path, monkeypatch):
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[storage]\nallowed_urls = ["s3://team/", "file:///data/shared/"]\n')
    settings = StorageSettings(cluster_file=cluster)
    policy = settings.storage_policy(tmp_path / "data")
    assert policy.allowed_urls == ("s3://team/", "file:///data/shared/")
    assert policy.storage_root == f"file://{tmp_path}/data/storage"
    assert (
        StorageSettings(cluster_file=tmp_path / "none.toml").storage_policy(tmp_path).allowed_urls
        == DEFAULT_ALLOWED_URLS
    )
    monkeypatch.setenv("TRAINMASTER_ALLOWED_URLS", '["https://"]')
    assert StorageSettings(cluster_file=cluster).storage_policy(tmp_path).allowed_urls == ("https://",)
    monkeypatch.delenv("TRAINMASTER_ALLOWED_URLS")
    cluster.write_text('[storage]\nallowed_urls = "everything"\n')
    with pytest.raises(ValueError, match="allowed_urls"):
        StorageSettings(cluster_file=cluster).storage_policy(tmp_path)


def test_a_cluster_file_there_but_unusable_stops_the_process_instead_of_widening_the_allow_list(tmp_path):
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[storage]\nallowed_urls = ["https://datasets.internal/"\n')  # the bracket never closed
    with pytest.raises(ClusterFileError, match="cluster.toml"):
        StorageSettings(cluster_file=cluster).storage_policy(tmp_path)


def test_the_hosts_jobs_may_reach_come_from_the_cluster_file_or_the_environment(tmp_path, monkeypatch):
    cluster = tmp_path / "cluster.toml"
    assert StorageSettings(cluster_file=cluster).storage_policy(tmp_path).allow_hosts == ()
    cluster.write_text('[storage]\nallow_hosts = ["datasets.internal", "10.20.0.0/16"]\n')
    policy = StorageSettings(cluster_file=cluster).storage_policy(tmp_path)
    assert policy.allow_hosts == ("datasets.internal", "10.20.0.0/16")
    assert policy.egress().host_allowed("DATASETS.internal") and len(policy.egress().allow_networks) == 1
    assert policy.allowed_urls == DEFAULT_ALLOWED_URLS  # allowing a host lists no bucket or path
    monkeypatch.setenv("TRAINMASTER_EGRESS_ALLOW", "127.0.0.1, ")
    assert StorageSettings(cluster_file=cluster).storage_policy(tmp_path).allow_hosts == ("127.0.0.1",)
    monkeypatch.setenv("TRAINMASTER_EGRESS_ALLOW", "10.0.0.0/33")
    with pytest.raises(ValueError):  # at start, not when a job needs it
        StorageSettings(cluster_file=cluster).storage_policy(tmp_path)
    monkeypatch.delenv("TRAINMASTER_EGRESS_ALLOW")
    cluster.write_text('[storage]\nallow_hosts = "10.0.0.0/8"\n')
    with pytest.raises(ValueError, match="allow_hosts"):
        StorageSettings(cluster_file=cluster).storage_policy(tmp_path)
