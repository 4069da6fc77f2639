"""Where a job may read and write: its own project's storage and the URLs the operator allows (pure checks).

A project's storage is `<storage root>/<project>/` and `<checkpoint root>/<project>/` (checkpoints live at
`<checkpoint root>/<project>/<job>`). Any other URL must start with an entry of the cluster's allow-list
(`[storage] allowed_urls` in the cluster file, or TRAINMASTER_ALLOWED_URLS); local paths are resolved (`..`,
symlinks) before they are compared, so `file:///data/shared/../../etc` is `/etc`. An http(s) URL must also reach a
public address or a host the operator allows (`[storage] allow_hosts`, TRAINMASTER_EGRESS_ALLOW): shared.egress.
"""

import ipaddress
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared import egress
from shared.cluster import read_cluster

# Public downloads only (http(s) to public addresses, shared.egress): no bucket and nothing on the local filesystem
# but a project's own storage unless the operator lists it.
DEFAULT_ALLOWED_URLS = ("https://", "http://")


class StorageError(ValueError):
    """A URL a job may not use; the message says why."""


class StoragePolicy(BaseModel):
    """The allow-list and the roots under which each project has its own prefix."""

    model_config = ConfigDict(frozen=True)

    allowed_urls: tuple[str, ...] = DEFAULT_ALLOWED_URLS
    allow_hosts: tuple[str, ...] = Field(
        (),
        description="Hosts, IPs or networks an http(s) URL may reach although "
        "they are not public (shared.egress.Policy entries).",
    )
    storage_root: str = Field(description="Projects' storage: <root>/<project>/ (file:// or a remote URL).")
    checkpoint_root: str = Field(description="Checkpoints: <root>/<project>/<job>.")

    def project_prefixes(self, project_id: str) -> tuple[str, ...]:
        return tuple(f"{root.rstrip('/')}/{project_id}/" for root in (self.storage_root, self.checkpoint_root))

    def checkpoint_url(self, *, project_id: str, job_id: str) -> str:
        return f"{self.checkpoint_root.rstrip('/')}/{check_segment(project_id)}/{check_segment(job_id)}"

    def egress(self) -> egress.Policy:
        """Where a job's http(s) URLs may connect."""
        return egress.Policy.parse(self.allow_hosts)


class StorageSettings(BaseSettings):
    """The storage settings every process that checks URLs reads (the submitter and the agents)."""

    model_config = SettingsConfigDict(env_prefix="TRAINMASTER_", extra="ignore")

    cluster_file: Path = Field(Path("cluster.toml"), description="Its [storage] section holds allowed_urls.")
    storage_file: Path | None = Field(
        None,
        description="Where [storage] is read when not the cluster file (an "
        "on-demand agent's own cluster file has only its node).",
    )
    allowed_urls: list[str] | None = Field(None, description="JSON list; overrides the cluster file's.")
    egress_allow: str | None = Field(
        None,
        description="Comma-separated hosts, IPs or networks a job's http(s) URLs "
        "may reach although not public; overrides the cluster file's allow_hosts.",
    )
    storage_url: str | None = Field(None, description="Projects' storage root; default file://<data_dir>/storage.")
    checkpoint_url: str | None = Field(None, description="Checkpoint root; default file://<data_dir>/checkpoints.")

    def storage_policy(self, data_dir: Path) -> StoragePolicy:
        path = self.storage_file or self.cluster_file
        section = cluster_storage(path)
        try:
            allowed = self.allowed_urls if self.allowed_urls is not None else cluster_allowed_urls(section)
            hosts = self.egress_allow.split(",") if self.egress_allow is not None else cluster_allow_hosts(section)
            hosts = tuple(h.strip() for h in hosts if h.strip())
            egress.Policy.parse(hosts)  # a bad network stops the process at start, not a job later
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        data = data_dir.resolve()
        return StoragePolicy(
            allowed_urls=tuple(allowed),
            allow_hosts=hosts,
            storage_root=self.storage_url or f"file://{data / 'storage'}",
            checkpoint_root=self.checkpoint_url or f"file://{data / 'checkpoints'}",
        )


def cluster_storage(path: Path) -> dict:
    """The `[storage]` section of a cluster file (empty when the file or the section is missing). A file that is
    there but unusable raises `ClusterFileError`: the process stops at start rather than run on the default
    allow-list, which may be wider than the one the file meant."""
    return read_cluster(path, missing_ok=True).storage


def cluster_allowed_urls(section: dict) -> tuple[str, ...]:
    """`allowed_urls` of a `[storage]` section; the default when it has none."""
    allowed = section.get("allowed_urls")
    if allowed is None:
        return DEFAULT_ALLOWED_URLS
    if not isinstance(allowed, list) or not all(isinstance(a, str) and "://" in a for a in allowed):
        raise ValueError('[storage] allowed_urls must be a list of URL prefixes such as "s3://bucket/"')
    return tuple(allowed)


def cluster_allow_hosts(section: dict) -> tuple[str, ...]:
    """`allow_hosts` of a `[storage]` section (none by default)."""
    hosts = section.get("allow_hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise ValueError('[storage] allow_hosts must be a list of hosts, IPs or networks such as "10.20.0.0/16"')
    return tuple(hosts)


def check_segment(value: str) -> str:
    """An id that becomes one path segment: letters, digits, `_`, `-`, `.`, not starting with a dot."""
    if (
        not value
        or len(value) > 128
        or value[0] == "."
        or any(not (c.isascii() and (c.isalnum() or c in "_-.")) for c in value)
    ):
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


# an http(s) URL's authority whose host is an IPv6 literal: [userinfo@][address](:port)
BRACKETED = re.compile(r"(?P<user>[^@\[\]]*@)?\[(?P<address>[^\]]*)\](?::[0-9]*)?")


def without_ipv6_host(url: str) -> str:
    """The URL with an http(s) URL's bracketed IPv6 host taken out, so that its `::` is not read as a chain (where
    the address may connect is shared.egress's to judge); StorageError when the brackets hold anything else."""
    if not egress.is_http(url):
        return url
    scheme, rest = url.split("://", 1)
    end = next((i for i, c in enumerate(rest) if c in "/?#"), len(rest))
    authority = rest[:end]
    if "[" not in authority and "]" not in authority:
        return url
    match = BRACKETED.fullmatch(authority)
    if match is None:
        raise StorageError("the URL's host is not a valid IPv6 address in brackets")
    address = match["address"]
    if "%" in address:
        raise StorageError("zone ids (%) are not allowed in an IPv6 address")
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        raise StorageError(f"{address!r} is not an IPv6 address") from None
    return f"{scheme}://{authority.replace(f'[{address}]', '[ipv6]')}{rest[end:]}"


def check_url(url: str, *, policy: StoragePolicy, project_id: str) -> str:
    """Return `url` when the project's job may use it; raise StorageError saying why not."""
    if "\x00" in url or any(ord(c) < 32 for c in url):
        raise StorageError("control characters are not allowed")
    if "::" in without_ipv6_host(url):
        raise StorageError("chained URLs (::) are not allowed")
    own = policy.project_prefixes(check_segment(project_id))
    path = local_path(url)
    if path is not None:
        if any(_inside(path, prefix) for prefix in (*own, *policy.allowed_urls) if local_path(prefix) is not None):
            return url
        raise StorageError(
            f"local path {path} is outside this project's storage ({own[0]}) and the cluster's "
            f"allowed URLs ({', '.join(policy.allowed_urls) or 'none'})"
        )
    scheme, rest = url.split("://", 1)
    if ".." in rest.split("/"):
        raise StorageError("`..` is not allowed in a URL")
    normalized = f"{scheme.lower()}://{rest}"
    if any(normalized.startswith(prefix) for prefix in (*own, *policy.allowed_urls)):
        return url
    raise StorageError(
        f"not in this project's storage ({own[0]}) or the cluster's allowed URLs "
        f"({', '.join(policy.allowed_urls) or 'none'})"
    )


def local_check(policy: StoragePolicy, project_id: str) -> Callable[[str], str]:
    """`check_url` of a local path as resolved when it is used (`services.agent.checkpoints.Mirror`): a link planted
    at or above a job's `file://` URL after its admission moves it nowhere the job may not go."""
    return lambda path: check_url(f"file://{path}", policy=policy, project_id=project_id)


def job_urls(algorithm: Any) -> Iterator[tuple[str, str]]:
    """(field, url) of every URL of an algorithm, fields named as in the API's errors."""
    if algorithm.code_dir:
        yield "algorithm.code_dir", algorithm.code_dir
    for i, item in enumerate(algorithm.inputs):
        yield f"algorithm.inputs.{i}.url", item.url
    for i, item in enumerate(algorithm.outputs):
        yield f"algorithm.outputs.{i}.url", item.url


def refused_urls(algorithm: Any, *, policy: StoragePolicy, project_id: str) -> list[tuple[str, str]]:
    """(field, reason) for each URL of the algorithm the project may not use (the pure checks; the addresses an
    http(s) URL resolves to are refused_addresses')."""
    problems = []
    for field, url in job_urls(algorithm):
        try:
            check_url(url, policy=policy, project_id=project_id)
            if field.startswith("algorithm.outputs.") and egress.is_http(url):
                raise StorageError("outputs cannot be http(s) URLs (the agent fetches http(s), never sends to it)")
        except StorageError as exc:
            problems.append((field, str(exc)))
    return problems


async def refused_addresses(
    algorithm: Any, *, policy: StoragePolicy, resolve: egress.Resolver = egress.system_resolve
) -> list[tuple[str, str]]:
    """(field, reason) for each http(s) URL of the algorithm whose host resolves to an address the job may not
    reach (loopback, private, link-local and the rest of shared.egress, unless the operator allows it)."""
    return await egress.refused_http(job_urls(algorithm), policy.egress(), resolve=resolve)
