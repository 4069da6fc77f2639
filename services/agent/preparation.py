"""Before a task starts: its training environment (a cached virtual environment), its code and its inputs."""

import asyncio
import hashlib
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from shlex import quote

from shared.egress import is_http
from shared.events import StartTask
from shared.jobs import DataOut, Engine, data_env_name
from shared.storage import StoragePolicy, local_check
from services.agent.checkpoints import Mirror
from services.agent.downloads import Downloads
from services.agent.sizecap import Tally, TooLarge
from services.agent.transfers import transfer_unless_stalled

log = logging.getLogger(__name__)
PIP_TIMEOUT_S = 900
# What an engine's build is given of the agent's environment: where programs are, the locale, and how the operator
# configured pip to reach its index (PIP_*, proxies, CA bundles); nothing else the agent holds.
BUILD_VARIABLES = frozenset(
    {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"}  # pip's config and cache
    | {"SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"}
    | {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"}  # either case, as pip reads them
)


def build_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` an engine's `python -m venv` and `pip install` run with (`BUILD_VARIABLES`, any
    `PIP_*`); PATH the system's default where the agent has none."""
    kept = {
        name: value for name, value in environ.items() if name.upper() in BUILD_VARIABLES or name.startswith("PIP_")
    }
    kept.setdefault("PATH", os.defpath)
    return kept


Note = Callable[[str], None]


class PrepareError(Exception):
    """The task cannot start: its environment, code or inputs could not be prepared (the message says why)."""


def output_dir(workdir: Path, output: DataOut) -> Path:
    return workdir / "outputs" / (output.local_dir or output.name)


AGENT_ENVIRONMENT = "agent"  # an engine whose `environment` is this runs tasks in the agent's own Python environment


class Preparer:
    def __init__(
        self,
        root: Path,
        catalogue: dict[str, dict],
        *,
        downloads: Downloads | None = None,
        caps: Callable[[], Tally] = Tally,
        storage: StoragePolicy | None = None,
    ) -> None:
        self.root = root
        self.storage = storage  # what a job's local paths are checked against again, as resolved when fetched
        self.downloads = downloads or Downloads()  # http(s): public addresses only unless the operator allows
        self.caps = caps  # a fresh tally per task: what its code and inputs may write (default: no cap)
        # engine name -> {"packages": [...], "image": ..., "environment": ..., "default": bool} from the cluster file
        self.catalogue = catalogue
        self.default = next((name for name, entry in sorted(catalogue.items()) if entry.get("default")), None)
        self.locks: dict[str, asyncio.Lock] = {}

    def engine_of(self, start: StartTask) -> Engine | None:
        """The job's engine, or the node's default one when it names none."""
        return start.algorithm.engine or (Engine(name=self.default) if self.default else None)

    def needs_work(self, start: StartTask) -> bool:
        alg, engine = start.algorithm, self.engine_of(start)
        return bool(alg.code_dir or alg.inputs or (engine and not self._cached(engine)))

    async def prepare(self, start: StartTask, workdir: Path, env: dict[str, str], note: Note) -> str:
        """Make the attempt's directory ready and return the command to run."""
        alg, tally = start.algorithm, self.caps()
        python = "python3"
        if engine := self.engine_of(start):
            venv = await self.engine(engine, note)
            env["VIRTUAL_ENV"] = str(venv)
            env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
            python = str(venv / "bin" / "python")
        if alg.code_dir:
            note(f"fetching code from {alg.code_dir}")
            await self._fetch(alg.code_dir, workdir / "code", what="code_dir", tally=tally, project=start.project_id)
            env["TRAINMASTER_CODE_DIR"] = str(workdir / "code")
        for item in alg.inputs:
            target = workdir / "inputs" / (item.local_dir or item.name)
            note(f"fetching input {item.name} from {item.url}")
            await self._fetch(item.url, target, what=f"inputs.{item.name}", tally=tally, project=start.project_id)
            env[f"TRAINMASTER_INPUT_{data_env_name(item.name)}"] = str(target)
        for out in alg.outputs:
            output_dir(workdir, out).mkdir(parents=True, exist_ok=True)
            env[f"TRAINMASTER_OUTPUT_{data_env_name(out.name)}"] = str(output_dir(workdir, out))
        if alg.command:
            return alg.command
        if not alg.boot_file:
            raise ValueError("the algorithm names neither a command nor a boot_file")
        return f"{quote(python)} {quote(str(workdir / 'code' / alg.boot_file))}"

    async def _fetch(self, url: str, target: Path, *, what: str, tally: Tally, project: str) -> None:
        try:
            if is_http(url):  # the egress policy, checked at each connection (DNS may have changed since submission)
                await self.downloads.fetch(url, target, tally)
                return
            check = local_check(self.storage, project) if self.storage is not None else None
            # a storage that moves nothing for `STALL_S`: the start fails, said why
            files = await transfer_unless_stalled(
                partial(Mirror(url, check=check).restore, target, tally), project=project
            )
        except TooLarge as exc:  # the task will not run: what this fetch wrote goes too
            await asyncio.to_thread(shutil.rmtree, target, True)
            raise PrepareError(f"{what}: cannot fetch {url}: {exc}") from exc
        except Exception as exc:
            raise PrepareError(f"{what}: cannot fetch {url}: {exc}") from exc
        if not files:
            raise PrepareError(f"{what}: nothing at {url}")

    def packages(self, engine: Engine) -> tuple[list[str], str | None]:
        entry = self.catalogue.get(engine.name or "", {})
        if engine.name and not entry and not engine.packages and not engine.image:
            raise PrepareError(
                f"engine {engine.name!r} is not in this node's catalogue "
                f"(has: {', '.join(sorted(self.catalogue)) or 'none'})"
            )
        return sorted(set(entry.get("packages", [])) | set(engine.packages)), engine.image or entry.get("image")

    def _key(self, packages: list[str]) -> str:
        payload = json.dumps({"python": sys.version.split()[0], "packages": packages})
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def existing(self, engine: Engine) -> Path | None:
        """The environment a catalogue entry names (`environment = "agent"`, or an absolute path), used as it is."""
        where = self.catalogue.get(engine.name or "", {}).get("environment")
        if not where:
            return None
        if engine.packages or engine.image:
            raise PrepareError(
                f"engine {engine.name!r} is an existing environment of the node: nothing can be "
                "installed into it (give the packages under another engine name)"
            )
        path = Path(sys.prefix) if where == AGENT_ENVIRONMENT else Path(where)
        if not path.is_absolute() or not (path / "bin" / "python").exists():
            raise PrepareError(f"engine {engine.name!r}: {where!r} is not a Python environment of this node")
        return path

    def _cached(self, engine: Engine) -> bool:
        try:
            if self.existing(engine):
                return True
            packages, _ = self.packages(engine)
        except PrepareError:
            return False
        return (self.root / self._key(packages) / ".ready").exists()

    async def engine(self, engine: Engine, note: Note) -> Path:
        """The engine's virtual environment, built once per node and content (its key), then reused; or the
        existing environment its catalogue entry names."""
        if existing := self.existing(engine):  # nothing to prepare, nothing to say (the default engine of every job)
            return existing
        packages, image = self.packages(engine)
        if image and not packages:
            runtime = shutil.which("docker") or shutil.which("podman")
            raise PrepareError(
                f"engine image {image}: running containers needs a container engine on the node "
                f"({'found ' + runtime + ' but' if runtime else 'none found, and'} this agent runs "
                "tasks as processes); give the engine's packages to use a virtual environment"
            )
        key = self._key(packages)
        venv = self.root / key
        async with self.locks.setdefault(key, asyncio.Lock()):
            if (venv / ".ready").exists():
                note(f"engine {engine.name or key} ready (cached environment {key})")
                return venv
            note(f"preparing engine {engine.name or key}: pip install {' '.join(packages)}")
            shutil.rmtree(venv, ignore_errors=True)  # what a failed build left (it has no .ready)
            await self._run([sys.executable, "-m", "venv", str(venv)], what="python -m venv")
            if packages:
                await self._run(
                    [
                        str(venv / "bin" / "python"),
                        "-m",
                        "pip",
                        "install",
                        "--disable-pip-version-check",
                        "--no-input",
                        "--only-binary=:all:",  # wheels only: no package's build code runs here, as the agent
                        *packages,
                    ],
                    what="pip install",
                )
            (venv / ".ready").write_text(json.dumps(packages))
            note(f"engine {engine.name or key} prepared")
            return venv

    async def _run(self, argv: list[str], *, what: str) -> None:
        # readable by every task user whatever the agent's umask (an environment holds no secret); with only the
        # variables pip and venv read, never the agent's own (its credentials' paths, a cloud's keys)
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            umask=0o022,
            env=build_environment(os.environ),
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), timeout=PIP_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            raise PrepareError(f"{what} took longer than {PIP_TIMEOUT_S}s") from None
        if process.returncode:
            tail = "\n".join(output.decode(errors="replace").strip().splitlines()[-15:])
            raise PrepareError(f"{what} failed (exit {process.returncode}):\n{tail}")
