#!/usr/bin/env bash
# Installs spherepde into the active Python (>= 3.11): a CPU build of PyTorch when no torch is present, then the
# package in editable mode.  `bash scripts/setup.sh test` also installs what the test suite uses: the optional
# extras shtns (built from source: FFTW headers from apt on Debian/Ubuntu) and sweep (Dask), the test tools, and
# the docs extra (Sphinx and its extensions: CI builds the docs).
#
# PyTorch: PyPI's Linux x86_64 wheel is the CUDA build (several GB with its nvidia-* packages), so the torch wheel
# alone is taken first, and only a CPU build (no nvidia-* requirement): from the wheels your pip configuration
# provides locally (find-links), else from PyTorch's CPU index ($SPHEREPDE_TORCH_INDEX to use another index of
# CPU builds); its dependencies then come from PyPI with the package.  SPHEREPDE_TORCH=pypi takes PyPI's default
# build instead (CUDA on Linux x86_64).  An installed torch, CPU or CUDA, is always kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
PIP=("$PYTHON" -m pip install -q)
EXTRAS=""

if [ "${1:-}" = "test" ]; then
    EXTRAS="[test,shtns,sweep,docs]"
    if command -v dpkg >/dev/null 2>&1 && ! dpkg -s libfftw3-dev >/dev/null 2>&1; then
        SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        $SUDO apt-get update -qq
        $SUDO apt-get install -y -qq libfftw3-dev >/dev/null
    fi
fi

# A CPU build of torch (no nvidia-* requirement in its metadata) downloaded into $1 by `pip download $2...`.
cpu_wheel() {
    local folder="$1"; shift
    "$PYTHON" -m pip download -q --no-deps -d "$folder" "$@" "torch>=2.4" >/dev/null 2>&1 || return 1
    "$PYTHON" - "$folder" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("torch-*.whl"))
metadata = next(name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".dist-info/METADATA"))
sys.exit(b"Requires-Dist: nvidia" in zipfile.ZipFile(wheel).read(metadata))
PY
}

if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    if [ "${SPHEREPDE_TORCH:-cpu}" = "pypi" ]; then
        "${PIP[@]}" "torch>=2.4"
    else
        INDEX="${SPHEREPDE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
        LOCAL="$(mktemp -d)"; REMOTE="$(mktemp -d)"
        trap 'rm -rf "$LOCAL" "$REMOTE"' EXIT
        if cpu_wheel "$LOCAL" --no-index; then          # wheels pip's configuration provides (find-links)
            "${PIP[@]}" "$LOCAL"/torch-*.whl
        elif cpu_wheel "$REMOTE" --retries 1 --timeout 30 --index-url "$INDEX"; then
            "${PIP[@]}" "$REMOTE"/torch-*.whl
        else
            echo "setup.sh: no CPU build of torch at $INDEX nor among local wheels. Install torch first:" >&2
            echo "  CPU:  pip install torch --index-url https://download.pytorch.org/whl/cpu" >&2
            echo "  CUDA: pip install torch   (PyPI; or --index-url https://download.pytorch.org/whl/cu126, ...)" >&2
            echo "or rerun with SPHEREPDE_TORCH=pypi to take PyPI's default build (CUDA on Linux x86_64)." >&2
            exit 1
        fi
    fi
fi
"${PIP[@]}" -e ".$EXTRAS"
