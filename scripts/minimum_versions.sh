#!/usr/bin/env bash
# The test suite under the lowest versions that pyproject.toml allows of its dependencies, torch excepted (a bound's
# own version where it names the patch, else the latest patch of its minor series: numpy 1.26.*, netCDF4 1.7.5, ...),
# in a fresh virtual environment (default: a temporary folder, removed at the end; `bash scripts/minimum_versions.sh
# DIR` keeps it in DIR), installed by `scripts/setup.sh test` under pip constraints.  pandas stays below 3: xarray
# before 2025.8 cannot write strings held as Python objects (as every string variable read back from a NetCDF file
# is) with pandas 3 ("unsupported dtype for netCDF4 variable: object").  torch is the one setup.sh finds (its lower
# bound, 2.4, is not tested here: its CPU wheels come from PyTorch's index).  A few minutes: the build of shtns,
# then the default test run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ -n "${1:-}" ]; then
    VENV="$1"
else
    VENV="$(mktemp -d)"
    trap 'rm -rf "$VENV"' EXIT
fi
"$PYTHON" -m venv "$VENV"
CONSTRAINTS="$VENV/constraints.txt"
"$PYTHON" - pyproject.toml > "$CONSTRAINTS" <<'PY'
import re, sys, tomllib
requirements = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
for requirement in requirements:
    bound = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", requirement)
    if bound is None:
        sys.exit(f"minimum_versions.sh: no lower bound of the form NAME>=VERSION in {requirement!r} (pyproject.toml)")
    name, lowest = bound.groups()
    if name != "torch":
        print(f"{name}=={lowest}.*" if lowest.count(".") < 2 else f"{name}=={lowest}")
print("pandas<3")
PY
echo "minimum_versions.sh: constraints $(tr '\n' ' ' < "$CONSTRAINTS")"
PIP_CONSTRAINT="$CONSTRAINTS" PYTHON="$VENV/bin/python" bash scripts/setup.sh test
"$VENV/bin/python" - "$CONSTRAINTS" <<'PY'
import importlib.metadata, re, sys
names = [re.match(r"[A-Za-z0-9_.-]+", line).group() for line in open(sys.argv[1])]
print("minimum_versions.sh: installed", " ".join(f"{name} {importlib.metadata.version(name)}" for name in names))
PY
"$VENV/bin/python" -m pytest -q
