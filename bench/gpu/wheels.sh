#!/usr/bin/env bash
# Makes .whl/, the project's dependencies as wheels for a GPU machine that has Python 3.12 with torch (CUDA) and no
# package index (bench/gpu/run.sh installs them there): every dependency of pyproject.toml but those the machine
# brings (torch, numpy, scipy, psutil, fsspec), with theirs, and the test runner's (pytest, pytest-asyncio,
# pytest-timeout). nkeys has no wheel: it is built here. Run from the repository root, on a machine with the index:
#   bash bench/gpu/wheels.sh    (then name ".whl" in the device call's carry)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${DEST:-.whl}"
PY="${PYTHON:-python3}"
mkdir -p "$DEST"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude

requirements=$(mktemp)
"$PY" - "$requirements" <<'EOF'
import re, sys, tomllib

BROUGHT = {"torch", "numpy", "scipy", "psutil", "fsspec", "nkeys"}  # on the GPU machine, or built below (nkeys)
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
test = {re.split(r"[\[=<>]", r)[0]: r for r in project["optional-dependencies"]["test"]}
wanted = [r for r in project["dependencies"] if re.split(r"[\[=<>]", r)[0] not in BROUGHT]
wanted += [test[name] for name in ("pytest", "pytest-asyncio", "pytest-timeout")]
wanted += ["pynacl", "cffi", "pycparser"]  # nkeys's, which pip cannot follow from a built wheel with --no-deps
open(sys.argv[1], "w").write("\n".join(wanted) + "\n")
EOF
platforms=()
# the oldest glibc first: pip prefers the platforms in the order given, and an older build runs on more machines
for tag in manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_26 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
    manylinux_2_34 manylinux_2_35; do
    platforms+=(--platform "${tag}_x86_64")
done
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d "$DEST" -r "$requirements"
nkeys=$(grep -o '"nkeys==[^"]*"' pyproject.toml | tr -d '"')
"$PY" -m pip wheel -q --no-deps -w "$DEST" "$nkeys"
rm -f "$requirements"
duplicates=$(ls "$DEST" | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$duplicates" ]; then
    echo "two versions of: $duplicates (the machine's pip installs none of them then)" >&2
    exit 1
fi
echo "$(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
