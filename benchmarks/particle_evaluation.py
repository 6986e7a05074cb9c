"""One evaluation of J and dJ/dW of M particle trainings batched in one program, per member, at today's code and at
other commits, side by side in one run.

    OMP_NUM_THREADS=1 python3 benchmarks/particle_evaluation.py [--members 20] [--t-end 80] [--commits C ...]
                                                                [--serial-commit 77c4626]

The seed-scale particle training of benchmarks/ensembles.py's section 3 (the bow case, N = 64 tokens,
particles.dt = time.dt = 0.01, seeds 0..M-1, W = 0).  Each commit is checked out with git archive into a temporary
folder and measured in a child process (benchmarks/ensembles.in_baseline) with its M members batched;
--serial-commit (the commit the ensembles issue started from, which had no member axis) is measured serially, one
member.  Times are one thread's CPU time of one evaluation, per member.
"""

import argparse
import json
import sys
import time

import torch
from ensembles import BASELINE, BOW, in_baseline, load
from floors import use_threads

CHILD = r'''
import json, os, sys, time, warnings
import torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
import spherepde
from solvers.particle_training import ParticleControl
settings = json.loads(sys.argv[2])
def load(seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return spherepde.load_case(os.path.join(sys.argv[1], "cases", "seed004-bow-k2.toml"), settings["overrides"]
                                   + [f"particles.seed={seed}"])
members = settings["members"]
if members == 1:
    control = ParticleControl(load(0))
    zero = torch.zeros((control.layers, 2, 2), dtype=torch.float64)
    start = time.thread_time(); control.gradient(zero); seconds = time.thread_time() - start
else:
    control = ParticleControl([load(seed) for seed in range(members)])
    zero = torch.zeros((members, control.layers, 2, 2), dtype=torch.float64)
    start = time.thread_time(); control.gradients(zero); seconds = time.thread_time() - start
foreign = [name for name, module in sys.modules.items() if name.split(".")[0] in ("spherepde", "solvers")
           and getattr(module, "__file__", None) and not module.__file__.startswith(sys.argv[1])]
assert not foreign, f"modules not from the checked-out commit: {foreign}"
print(json.dumps({"per_member": seconds / members, "steps": control.steps}))
'''


def overrides(t_end: float) -> list:
    return ["solver.method='particles'", "particles.n=64", f"time.t_end={t_end}"]


def today(members: int, t_end: float) -> dict:
    """Today's batched evaluation, per member (seconds) and its steps."""
    from solvers.particle_training import ParticleControl

    control = ParticleControl([load(BOW, overrides(t_end) + [f"particles.seed={seed}"]) for seed in range(members)])
    zero = torch.zeros((members, control.layers, 2, 2), dtype=torch.float64)
    start = time.thread_time()
    control.gradients(zero)
    return {"per_member": (time.thread_time() - start) / members, "steps": control.steps}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=20)
    parser.add_argument("--t-end", type=float, default=80.0)
    parser.add_argument("--commits", nargs="*", default=[], help="commits measured batched like today's code")
    parser.add_argument("--serial-commit", default=BASELINE, help=f"measured serially (default {BASELINE})")
    args = parser.parse_args(argv)
    use_threads(1)
    settings = {"overrides": overrides(args.t_end)}
    rows = [(f"{args.serial_commit} serial", json.loads(in_baseline(args.serial_commit, CHILD, dict(
        settings, members=1)).strip().splitlines()[-1]))]
    for commit in args.commits:
        rows.append((f"{commit} M = {args.members}", json.loads(in_baseline(commit, CHILD, dict(
            settings, members=args.members)).strip().splitlines()[-1])))
    rows.append((f"today M = {args.members}", today(args.members, args.t_end)))
    reference = rows[0][1]["per_member"]
    print(f"particle evaluations, N = 64, T = {args.t_end:g}, one thread's CPU time per member:")
    for name, row in rows:
        print(f"   {name:28s} {row['per_member']:8.3f} s   {1e6 * row['per_member'] / row['steps']:8.1f} us a step   "
              f"{reference / row['per_member']:6.1f}x cheaper than {args.serial_commit} serial")


if __name__ == "__main__":
    sys.exit(main())
