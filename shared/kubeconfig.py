"""Where the Kubernetes API is and who a process is to it (placement, which rents Pods; the minter, which only reads
them, with credentials of its own): a kubeconfig file and one of its contexts (tokens, client certificates, exec
plugins such as `aws eks get-token`), an explicit server, or the pod's own service account. lightkube does the
speaking; this only chooses."""

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightkube.config.kubeconfig import SingleConfig

# lightkube (and yaml, httpx beneath it) is imported where a connection is chosen, not here: a process that only
# names IN_CLUSTER (the minter of a cluster renting no Pods) does not load it, about 0.9 s of CPU at each start

EXEC_VERSIONS = ("client.authentication.k8s.io/v1beta1", "client.authentication.k8s.io/v1alpha1")  # lightkube's
IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def connection(
    *,
    kubeconfig: Path | None,
    context: str | None,
    api_url: str | None,
    token_file: Path | None,
    ca_file: Path | None,
    service_account: Path = IN_CLUSTER,
) -> "SingleConfig":
    """The one configuration a process uses, in this order: the kubeconfig's context (its current one when none
    is named), an explicit `api_url` (with `token_file`/`ca_file`, else the service account's when present), the
    service account of the pod the process runs in (`KUBERNETES_SERVICE_HOST`, as the kubelet sets it)."""
    import yaml
    from lightkube import ConfigError

    try:
        config = _chosen(
            kubeconfig=kubeconfig,
            context=context,
            api_url=api_url,
            token_file=token_file,
            ca_file=ca_file,
            service_account=service_account,
        )
    except (ConfigError, KeyError, yaml.YAMLError) as exc:  # KeyError: a cluster or user the file does not have
        raise ValueError(f"Kubernetes API: {exc}") from None
    plugin = config.user.exec if config.user else None
    if plugin and plugin.apiVersion not in EXEC_VERSIONS:  # lightkube would fail each call later, not here
        raise ValueError(
            f"context {config.context_name!r}: exec plugin {plugin.command!r} speaks "
            f"{plugin.apiVersion}; {' or '.join(EXEC_VERSIONS)} is needed"
        )
    if config.cluster.insecure:
        raise ValueError(
            f"context {config.context_name!r} skips TLS verification: no credential is sent to "
            "an API server that cannot be verified"
        )
    return config


def _chosen(
    *,
    kubeconfig: Path | None,
    context: str | None,
    api_url: str | None,
    token_file: Path | None,
    ca_file: Path | None,
    service_account: Path,
) -> "SingleConfig":
    from lightkube import ConfigError, KubeConfig
    from lightkube.config.models import Cluster, User

    if kubeconfig is not None:
        return _found(KubeConfig.from_file(kubeconfig.expanduser()).get(context), f"{kubeconfig}: no context")
    if api_url is not None:
        token = token_file or _present(service_account / "token")
        ca = ca_file or _present(service_account / "ca.crt")
        cluster = Cluster(server=api_url, certificate_auth=str(ca) if ca else None)
        one = KubeConfig.from_one(cluster=cluster, user=User(token_file=str(token) if token else None))
        return _found(one.get(), f"{api_url}: no configuration")
    try:
        in_pod = KubeConfig.from_service_account(service_account).get()
    except (KeyError, ConfigError) as exc:  # not in a pod: no token mounted, no KUBERNETES_SERVICE_HOST/PORT
        raise ConfigError(f"no kubeconfig nor api_url set, and not running in a Kubernetes pod ({exc})") from None
    return _found(in_pod, "the pod's service account: no configuration")


def _found(config: "SingleConfig | None", missing: str) -> "SingleConfig":
    from lightkube import ConfigError

    if config is None:
        raise ConfigError(missing)
    return config


def _present(path: Path) -> Path | None:
    return path if path.exists() else None
