#!/usr/bin/env bash
# Installs what spherepde needs into the active Python (>= 3.11): FFTW headers for shtns
# (Debian/Ubuntu), a CPU build of PyTorch when no torch is present, then the package.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

if ! dpkg -s libfftw3-dev >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq libfftw3-dev >/dev/null
fi
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    # A plain 'torch' requirement would pull a multi-GB CUDA build; prefer the CPU wheel.
    "$PYTHON" -m pip install -q "torch==2.13.0" || "$PYTHON" -m pip install -q "torch>=2.4"
fi
"$PYTHON" -m pip install -q -e ".[test]"
