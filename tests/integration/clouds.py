"""The tests' clouds: moto's EC2 as a server on 127.0.0.1, a local instance-metadata endpoint, and machines that are
local processes (the test acts as the cloud or the kubelet and starts each rented node's agent as it was told)."""

import asyncio
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from services.stack.processes import stop_group, stop_groups

REPO = Path(__file__).resolve().parents[2]
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


def loopback_only(url: str) -> str:
    """Refuse anything but a loopback endpoint: these tests must never reach a real cloud."""
    if not url.startswith(("http://127.0.0.1:", "http://localhost:")):
        raise RuntimeError(f"refusing a non-loopback cloud endpoint in tests: {url}")
    return url


class Machines:
    """Rented nodes as local process groups, each started like the real node would be (a script or a command)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.running: dict[str, subprocess.Popen] = {}
        self.halting: list[threading.Thread] = []

    def base_env(self) -> dict[str, str]:
        """A fresh machine's environment: nothing of the test's or the stack's (no TRAINMASTER_*, no secrets)."""
        # its image's `python3` is the platform's Python (on this host's PATH it was a pyenv shim: a dozen bash
        # processes before each Python, over 15 s under a loaded suite, so a job's first line came after the test's
        # notice and its first attempt never ran)
        path = os.pathsep.join([str(self.firewall()), str(Path(sys.executable).parent), os.environ["PATH"]])
        return {"PATH": path, "HOME": str(self.root), "LANG": "C.UTF-8", "PYTHONPATH": str(REPO)}

    def firewall(self) -> Path:
        """A stand-in `nft` first on the machines' PATH, recording what a node's script tells it (in `nft.log`
        beside it): a rented node keeps its tasks from the instance metadata before its agent starts, and a test's
        machine must never change this host's firewall."""
        tools = self.root / "firewall"
        if not (tools / "nft").exists():
            tools.mkdir(parents=True, exist_ok=True)
            (tools / "nft").write_text(f'#!/bin/bash\n{{ echo "$*"; [ "$1" != -f ] || cat; }} >> {tools}/nft.log\n')
            (tools / "nft").chmod(0o755)
        return tools

    def boot(self, key: str, argv: list[str], *, env: dict[str, str] | None = None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = (self.root / f"{key}.console").open("ab")
        self.running[key] = subprocess.Popen(
            argv,
            env={**self.base_env(), **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.root,
        )

    def halt(self, key: str, *, timeout_s: float = 15) -> None:
        """What the cloud does to a terminated machine: SIGTERM (its agent reports on the way out), then off."""
        stop_group(self.running.pop(key, None), timeout_s=timeout_s)

    def halt_later(self, key: str, *, timeout_s: float = 15) -> None:
        """`halt`, in the background: a cloud boots a new machine while another one is stopping (a stopping agent
        whose identity was revoked with its release waits out its whole stop timeout, 15 s, which held every new
        machine's boot behind it)."""
        process = self.running.pop(key, None)
        thread = threading.Thread(target=stop_group, args=(process,), kwargs={"timeout_s": timeout_s}, daemon=True)
        thread.start()
        self.halting.append(thread)

    def halt_all(self) -> None:
        """Every machine at once (one after another, each agent's report on the way out was waited for in turn),
        and those stopping in the background waited for."""
        stop_groups([self.running.pop(key) for key in list(self.running)])
        for thread in self.halting:
            thread.join()


def agent_command() -> str:
    return f"{sys.executable} -m services.agent"


class Metadata:
    """Instance metadata (IMDSv2 tokens included), each machine's under /<instance id>/; the test sets notices."""

    def __init__(self) -> None:
        self.interruptions: dict[str, dict] = {}
        self.rebalances: dict[str, dict] = {}
        self.reads: dict[str, int] = {}
        metadata = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_PUT(self) -> None:
                _, instance, path = self.path.split("/", 2) if self.path.count("/") >= 2 else ("", "", "")
                self._answer(200, f"token-{instance}".encode()) if path == "latest/api/token" else self._answer(
                    404, b""
                )

            def do_GET(self) -> None:
                _, instance, path = self.path.split("/", 2) if self.path.count("/") >= 2 else ("", "", "")
                if self.headers.get("X-aws-ec2-metadata-token") != f"token-{instance}":
                    self._answer(401, b"")
                    return
                metadata.reads[instance] = metadata.reads.get(instance, 0) + 1
                doc = {
                    "latest/meta-data/spot/instance-action": metadata.interruptions.get(instance),
                    "latest/meta-data/events/recommendations/rebalance": metadata.rebalances.get(instance),
                }.get(path)
                self._answer(200, json.dumps(doc).encode()) if doc else self._answer(404, b"Not Found")

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def poll(check, *, timeout_s: float, interval_s: float = 0.3):
    """`check()` until it returns something truthy (then that), or fail after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{getattr(check, '__name__', 'check')} not reached in {timeout_s}s")
        await asyncio.sleep(interval_s)
