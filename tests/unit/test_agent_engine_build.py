"""An engine's packages are the job's, and so hostile: the agent (root) installs them from wheels only, so no build
code a package ships runs as the agent, and pip gets none of the agent's own environment. Real pip, no index: a
package folder given as pip's find-links."""

import io
import tarfile
from pathlib import Path

import pytest

from shared.jobs import Engine
from services.agent.preparation import BUILD_VARIABLES, PrepareError, Preparer, build_environment

# An sdist whose build backend lives in the sdist itself (no build requirement to fetch): pip runs it, in its
# isolated build, as whoever runs pip, the moment it considers building the package.
BACKEND = """
import pathlib
pathlib.Path({marker!r}).write_text("the package's build code ran")

def get_requires_for_build_wheel(config_settings=None):
    return []
"""
PYPROJECT = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'


def sdist(folder: Path, marker: Path) -> None:
    """`folder/buildcode-1.0.tar.gz`, a source distribution whose build writes `marker`."""
    files = {
        "buildcode-1.0/pyproject.toml": PYPROJECT,
        "buildcode-1.0/backend.py": BACKEND.format(marker=str(marker)),
        "buildcode-1.0/PKG-INFO": "Metadata-Version: 2.1\nName: buildcode\nVersion: 1.0\n",
    }
    folder.mkdir(parents=True)
    with tarfile.open(folder / "buildcode-1.0.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


async def test_a_package_only_its_own_build_could_install_is_refused_and_its_build_code_never_runs(
    tmp_path, monkeypatch
):
    marker = tmp_path / "ran"
    sdist(tmp_path / "index", marker)
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))  # the operator's pip settings reach pip
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    notes: list[str] = []
    with pytest.raises(PrepareError, match="pip install failed") as refused:
        await Preparer(tmp_path / "engines", {}).engine(Engine(packages=["buildcode==1.0"]), notes.append)
    assert not marker.exists(), "the package's build code ran as the agent"
    assert "No matching distribution" in str(refused.value) or "Could not find a version" in str(refused.value)


def test_pip_gets_the_variables_it_reads_and_none_of_the_agents_own():
    agent = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "https_proxy": "http://proxy:3128",
        "PIP_INDEX_URL": "https://mirror.example/simple",
        "TRAINMASTER_BUS_CREDS": "/etc/trainmaster/agent.creds",
        "AWS_SECRET_ACCESS_KEY": "hunter2",
        "PYTHONPATH": "/opt/agent",
    }
    assert build_environment(agent) == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "https_proxy": "http://proxy:3128",
        "PIP_INDEX_URL": "https://mirror.example/simple",
    }
    assert build_environment({})["PATH"]  # the system's default path where the agent has none
    assert not any(name.startswith(("TRAINMASTER", "AWS")) for name in BUILD_VARIABLES)
