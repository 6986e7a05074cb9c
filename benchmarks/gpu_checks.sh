#!/usr/bin/env bash
# The checks that need a CUDA device, in one run (about 7 minutes on an H200; the time limits of the
# parts add up to 620 s), most important first:
#   gpu_cuda_tests.txt      pytest -m cuda (CUDA against CPU: SHT, spectral field, Eulerian runs,
#                           adjoint gradients, fused particle attention)
#   gpu_baseline_run.txt    issue 5 criterion 4: the seed-003 baseline (lmax 128, t in [0, 3]) on the
#                           GPU, float64 and float32, and their diagnostics against each other
#   gpu_step_rate.txt       issue 5 benchmark (c): RK4 steps per second, CPU (1 thread)
#                           and GPU side by side, the GPU/CPU ratio and the achieved memory bandwidth
#   gpu_particles_s2.txt    issue 3 criterion 1 on S^2: particle runs of one system of n = 1e3, 1e4,
#   particles_s2.tar        1e5 tokens on the GPU against the Eulerian run (results/particles_verification/:
#                           the s2 summary of --device cuda and its *_cuda.png figures)
#   gpu_step_rate_more.txt  benchmark (c) with a general B (lmax 64, 128), and at lmax 256 with all cores
# Each part has its own time limit, so a slow part cannot starve the ones after it.
#
#     bash benchmarks/gpu_checks.sh OUTDIR [PART...]      (PART: cuda_tests, baseline_run, step_rate,
#                                                           particles_s2, step_rate_more; default all)
#
# Then `python3 results/spectral_verification.py --import-gpu OUTDIR` files gpu_env.txt and the gpu_*.txt of
# issue 5 (all but particles_s2) as the summaries of results/spectral_verification/runs/ (named by the command on
# each output's first line) and rewrites results/spectral_verification.md, which quotes them.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: gpu_checks.sh OUTDIR [PART...]}"
shift
PARTS="${*:-cuda_tests baseline_run step_rate particles_s2 step_rate_more}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# The CUDA tests in one process (one GPU context), as measured: -n 0 here, not on their command line, which
# results/spectral_verification.py --import-gpu checks against the plan's (the first line of each output)
export PYTEST_ADDOPTS="-n 0"

part() {  # part NAME SECONDS COMMAND...: run COMMAND under a time limit, output to OUT/gpu_NAME.txt
    local name=gpu_$1 limit=$2
    [[ " $PARTS " == *" $1 "* ]] || return 0
    shift 2
    echo "\$ $*" >"$OUT/$name.txt"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | grep --line-buffered -v '^\[SHTns' | tee -a "$OUT/$name.txt"
    echo "[$name: exit ${PIPESTATUS[0]}, $((SECONDS - start)) s]" | tee -a "$OUT/$name.txt"
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
    python3 -c "import torch, numpy, sys; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)"
    nproc
} >"$OUT/gpu_env.txt" 2>&1

part cuda_tests 120 python3 -m pytest -m cuda -q -p no:cacheprovider tests
part baseline_run 120 python3 benchmarks/baseline_run.py --devices cuda --filter-order 16 --out /tmp/baseline
part step_rate 100 python3 benchmarks/step_rate.py --devices cpu cuda
part particles_s2 200 python3 results/particles_verification.py --only s2 --device cuda
[[ " $PARTS " == *" particles_s2 "* ]] && tar -cf "$OUT/particles_s2.tar" results/particles_verification/runs/s2-*.json \
    results/particles_verification/rate_s2_cuda.png results/particles_verification/compare_s2_n10000_cuda.* 2>/dev/null
part step_rate_more 80 bash -c "python3 benchmarks/step_rate.py --devices cpu cuda --B general --lmax 64 128 \
    --dtypes float64 && python3 benchmarks/step_rate.py --devices cpu cuda --lmax 256 --dtypes float64 --threads $(nproc)"
