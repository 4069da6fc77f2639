"""Where a job may read and write: its own project's storage and the URLs the operator allows (pure checks).

A project's storage is `<storage root>/<project>/` and `<checkpoint root>/<project>/` (checkpoints live at
`<checkpoint root>/<project>/<job>`). Any other URL must start with an entry of the cluster's allow-list
(`[storage] allowed_urls` in the cluster file, or TRAINMASTER_ALLOWED_URLS); local paths are resolved (`..`,
symlinks) before they are compared, so `file:///data/shared/../../etc` is `/etc`.
"""
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# Remote schemes only: nothing on the local filesystem but a project's own storage unless the operator says so.
DEFAULT_ALLOWED_URLS = ("https://", "http://", "s3://")


class StorageError(ValueError):
    """A URL a job may not use; the message says why."""


class StoragePolicy(BaseModel):
    """The allow-list and the roots under which each project has its own prefix."""

    model_config = ConfigDict(frozen=True)

    allowed_urls: tuple[str, ...] = DEFAULT_ALLOWED_URLS
    storage_root: str = Field(description="Projects' storage: <root>/<project>/ (file:// or a remote URL).")
    checkpoint_root: str = Field(description="Checkpoints: <root>/<project>/<job>.")

    def project_prefixes(self, project_id: str) -> tuple[str, ...]:
        return tuple(f"{root.rstrip('/')}/{project_id}/" for root in (self.storage_root, self.checkpoint_root))

    def checkpoint_url(self, *, project_id: str, job_id: str) -> str:
        return f"{self.checkpoint_root.rstrip('/')}/{check_segment(project_id)}/{check_segment(job_id)}"


class StorageSettings(BaseSettings):
    """The storage settings every process that checks URLs reads (the submitter and the agents)."""

    model_config = SettingsConfigDict(env_prefix="TRAINMASTER_", extra="ignore")

    cluster_file: Path = Field(Path("cluster.toml"), description="Its [storage] section holds allowed_urls.")
    storage_file: Path | None = Field(None, description="Where [storage] is read when not the cluster file (an "
                                      "on-demand agent's own cluster file has only its node).")
    allowed_urls: list[str] | None = Field(None, description="JSON list; overrides the cluster file's.")
    storage_url: str | None = Field(None, description="Projects' storage root; default file://<data_dir>/storage.")
    checkpoint_url: str | None = Field(None, description="Checkpoint root; default file://<data_dir>/checkpoints.")

    def storage_policy(self, data_dir: Path) -> StoragePolicy:
        allowed = self.allowed_urls if self.allowed_urls is not None else \
            cluster_allowed_urls(self.storage_file or self.cluster_file)
        data = data_dir.resolve()
        return StoragePolicy(allowed_urls=tuple(allowed), storage_root=self.storage_url or f"file://{data / 'storage'}",
                             checkpoint_root=self.checkpoint_url or f"file://{data / 'checkpoints'}")


def cluster_allowed_urls(path: Path) -> tuple[str, ...]:
    """`[storage] allowed_urls` of a cluster file; the default when the file or the section has none."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return DEFAULT_ALLOWED_URLS
    allowed = data.get("storage", {}).get("allowed_urls")
    if allowed is None:
        return DEFAULT_ALLOWED_URLS
    if not isinstance(allowed, list) or not all(isinstance(a, str) and "://" in a for a in allowed):
        raise ValueError(f"{path}: [storage] allowed_urls must be a list of URL prefixes such as \"s3://\"")
    return tuple(allowed)


def check_segment(value: str) -> str:
    """An id that becomes one path segment: letters, digits, `_`, `-`, `.`, not starting with a dot."""
    if not value or len(value) > 128 or value[0] == "." or any(not (c.isascii() and (c.isalnum() or c in "_-."))
                                                                 for c in value):
        raise StorageError(f"{value!r} is not a valid id for a path")
    return value


def local_path(url: str) -> str | None:
    """The resolved local path of a file:// URL or a bare path; None for any other scheme."""
    if "://" not in url:
        path = url
    elif url.split("://", 1)[0].lower() == "file":
        path = url.split("://", 1)[1]
    else:
        return None
    if not path.startswith("/"):
        raise StorageError("a local path must be absolute")
    return os.path.realpath(path)


def _inside(path: str, prefix: str) -> bool:
    root = local_path(prefix)
    return root is not None and (path == root or path.startswith(root.rstrip("/") + "/"))


def check_url(url: str, *, policy: StoragePolicy, project_id: str) -> str:
    """Return `url` when the project's job may use it; raise StorageError saying why not."""
    if "\x00" in url or any(ord(c) < 32 for c in url):
        raise StorageError("control characters are not allowed")
    if "::" in url:
        raise StorageError("chained URLs (::) are not allowed")
    own = policy.project_prefixes(check_segment(project_id))
    path = local_path(url)
    if path is not None:
        if any(_inside(path, prefix) for prefix in (*own, *policy.allowed_urls) if local_path(prefix) is not None):
            return url
        raise StorageError(f"local path {path} is outside this project's storage ({own[0]}) and the cluster's "
                           f"allowed URLs ({', '.join(policy.allowed_urls) or 'none'})")
    scheme, rest = url.split("://", 1)
    if ".." in rest.split("/"):
        raise StorageError("`..` is not allowed in a URL")
    normalized = f"{scheme.lower()}://{rest}"
    if any(normalized.startswith(prefix) for prefix in (*own, *policy.allowed_urls)):
        return url
    raise StorageError(f"not in this project's storage ({own[0]}) or the cluster's allowed URLs "
                       f"({', '.join(policy.allowed_urls) or 'none'})")


def job_urls(algorithm) -> Iterator[tuple[str, str]]:
    """(field, url) of every URL of an algorithm, fields named as in the API's errors."""
    if algorithm.code_dir:
        yield "algorithm.code_dir", algorithm.code_dir
    for i, item in enumerate(algorithm.inputs):
        yield f"algorithm.inputs.{i}.url", item.url
    for i, item in enumerate(algorithm.outputs):
        yield f"algorithm.outputs.{i}.url", item.url


def refused_urls(algorithm, *, policy: StoragePolicy, project_id: str) -> list[tuple[str, str]]:
    """(field, reason) for each URL of the algorithm the project may not use."""
    problems = []
    for field, url in job_urls(algorithm):
        try:
            check_url(url, policy=policy, project_id=project_id)
        except StorageError as exc:
            problems.append((field, str(exc)))
    return problems
