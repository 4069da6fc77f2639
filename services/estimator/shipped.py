"""The history model shipped with trainmaster, and what it was trained from.

A fresh install serves it from its first second: no ETA waits ~1.5 minutes of CPU (more on a busy machine) for a
model trained at first start, and that training no longer takes a core beside the first jobs. It is what the code
beside it trains from the MLPerf logs (`make history-model` reproduces it): its provenance file names the format,
the digest of every source file the training runs and the tarballs it read. A model trained later, on the logs and
the platform's own completed jobs, supersedes it (`modelstore.ModelStore`).

    python -m services.estimator.shipped [--corpus DIR]   # train and write it (make history-model)
    python -m services.estimator.shipped --check          # is it what this code would train? (exit 1: no)
"""

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from services.estimator.model.history import FORMAT_VERSION

REPO = Path(__file__).resolve().parents[2]
SHIPPED = Path(__file__).resolve().parent / "model" / "history-shipped.npz"
PROVENANCE = SHIPPED.with_suffix(".json")
CORPUS = REPO.parent / "shared" / "data" / "mlperf"
# the training's own code: every module of the project that importing the trainer loads (torch's included)
_CLOSURE = """
import json, sys
from pathlib import Path
import services.estimator.train  # noqa: F401
from services.estimator.model.historynet import limit_threads  # noqa: F401  (loaded by the training itself)
root = Path(sys.argv[1])
print(json.dumps(sorted(
    str(p.relative_to(root))
    for m in list(sys.modules.values())
    if (f := getattr(m, "__file__", None)) and (p := Path(f).resolve()).is_relative_to(root)
    and p.parts[len(root.parts)] in ("services", "shared")
)))
"""


DATA_SUFFIXES = (".npz", ".json")  # weights and tables beside the training's modules (the curve prior's, say)


def training_sources() -> list[str]:
    """The project's source files the training runs, relative to the repository (in a process of its own: it loads
    torch, which the estimator never does), and the data files beside them (weights and tables a module of it may
    read: a retrained curve prior changes what the model's calibration saw), the shipped model's own two left out."""
    out = subprocess.run(
        [sys.executable, "-c", _CLOSURE, str(REPO)], capture_output=True, text=True, check=True, cwd=REPO
    )
    sources = json.loads(out.stdout)
    folders = {(REPO / name).parent for name in sources}
    data = [
        str(path.relative_to(REPO))
        for folder in folders
        for path in folder.iterdir()
        if path.suffix in DATA_SUFFIXES and path not in (SHIPPED, PROVENANCE)
    ]
    return sorted(sources + data)


def code_digest(sources: list[str]) -> str:
    digest = hashlib.sha256()
    for name in sources:
        digest.update(name.encode() + b"\0" + (REPO / name).read_bytes() + b"\0")
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def corpus_files(corpus: Path) -> list[Path]:
    return sorted(corpus.glob("*.tar.gz"))


def provenance(corpus: list[Path]) -> dict:
    """What a model trained now, by this code, from `corpus` would be."""
    sources = training_sources()
    return {
        "format_version": FORMAT_VERSION,
        "code_sha256": code_digest(sources),
        "sources": sources,
        "corpus": [{"name": p.name, "bytes": p.stat().st_size, "sha256": file_digest(p)} for p in corpus],
    }


def libraries() -> dict[str, str]:
    """The numerical libraries the training ran on (a retraining on others may differ in its last digits)."""
    out = subprocess.run(
        [sys.executable, "-c", "import json, numpy, torch; print(json.dumps([numpy.__version__, torch.__version__]))"],
        capture_output=True,
        text=True,
        check=True,
    )
    numpy_version, torch_version = json.loads(out.stdout)
    return {"numpy": numpy_version, "torch": torch_version}


def stale(recorded: dict, corpus: list[Path] | None) -> list[str]:
    """Why the shipped model is not what this code trains (from `corpus`, when given): empty when it is."""
    now = provenance(corpus or [])
    reasons = [
        f"{key}: shipped {recorded.get(key)!r}, now {now[key]!r}"
        for key in ("format_version", "code_sha256")
        if recorded.get(key) != now[key]
    ]
    if corpus is not None and recorded.get("corpus") != now["corpus"]:
        reasons.append(f"corpus: shipped {recorded.get('corpus')!r}, now {now['corpus']!r}")
    if SHIPPED.exists() and recorded.get("model_sha256") != file_digest(SHIPPED):
        reasons.append("model_sha256: the provenance file is not the shipped model's (make history-model)")
    if reasons and recorded.get("sources") != now["sources"]:
        reasons.append(f"sources: shipped {recorded.get('sources')!r}, now {now['sources']!r}")
    return reasons


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="the directory of MLPerf training-log tarballs")
    parser.add_argument("--check", action="store_true", help="only check that the shipped model is current")
    args = parser.parse_args()
    tarballs = corpus_files(args.corpus)
    if args.check:
        recorded = json.loads(PROVENANCE.read_text()) if PROVENANCE.exists() else {}
        if reasons := stale(recorded, tarballs if tarballs else None):
            raise SystemExit("the shipped history model is stale (make history-model):\n  " + "\n  ".join(reasons))
        print(f"the shipped history model is current: {SHIPPED.relative_to(REPO)}")
        return
    if not tarballs:
        raise SystemExit(f"no MLPerf tarballs in {args.corpus}")
    argv = [sys.executable, "-m", "services.estimator.train", "--out", str(SHIPPED), "--corpus", *map(str, tarballs)]
    subprocess.run(argv, check=True, cwd=REPO)  # the model itself is written whole (a file beside it, then renamed)
    recorded = provenance(tarballs) | {"model_sha256": file_digest(SHIPPED), "libraries": libraries()}
    tmp = PROVENANCE.with_suffix(".tmp")
    tmp.write_text(json.dumps(recorded, indent=1) + "\n")
    tmp.replace(PROVENANCE)
    print(f"wrote {SHIPPED.relative_to(REPO)} and {PROVENANCE.relative_to(REPO)}")


if __name__ == "__main__":
    main()
