"""The real servers an integration test talks to: NATS with trainmaster's streams and identities, and the embedded
database when asked, from a cluster file of the test's own."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from services.stack.processes import Stack, StackSettings
from tests.conftest import free_port


@contextmanager
def real_servers(data: Path, *, cluster: str, database: bool = False) -> Iterator[Stack]:
    """Start them under `data` (the cluster file's nodes get their bus identities); stop them at the end."""
    (data / "cluster.toml").write_text(cluster)
    stack = Stack(
        StackSettings(
            data_dir=data / "data",
            nats_port=free_port(),
            nats_url=None,
            mongo_url=None,
            cluster_file=data / "cluster.toml",
        )
    )
    stack.start_nats()
    stack.prepare_bus()
    if database:
        stack.start_database()
    try:
        yield stack
    finally:
        stack.stop_all()
