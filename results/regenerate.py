"""Every report of results/ from its committed summaries, nothing run:

    python3 results/regenerate.py [STUDY ...]

calls each study's script with its report-only option (REPORTS), in order, and says which reports and figures
changed (`git status`).  On a checkout whose summaries and code are committed together nothing should change.
The studies in NOT_REGENERABLE have no committed summaries yet: their reports were printed by runs of their
scripts, and making their summaries means running them again (the CPU time is each one's note).
"""

import os
import subprocess
import sys

import harness

REPORTS = {
    "core_verification": ["core_verification.py", "--report-only"],
    "adjoint_verification": ["adjoint_verification.py", "--report-only"],
    "spectral_verification": ["spectral_verification.py", "--report-only"],
    "seed004": ["seed004.py", "--report-only"],
    "paper003": ["paper003.py", "--full", "--report-only"],
}
NOT_REGENERABLE = {
    "seed004_reduced": "about 75 CPU min (Adam and L-BFGS trainings at the reduced scale)",
    "seed004_escape": "about 30 CPU min (the first gradient step at the seed's scale)",
    "seed004_particles": "about 2 CPU h (particle trainings, warm starts, systems up to N = 4096)",
    "seed004_candidates": "about 2.5 CPU h (redrawn candidates, perturbed starts, N up to 8192)",
    "seed004_readout": "about 1 CPU h (both bow cases, centred candidates)",
}


def main(argv=None) -> int:
    chosen = (argv if argv is not None else sys.argv[1:]) or list(REPORTS)
    unknown = [name for name in chosen if name not in REPORTS]
    if unknown:
        print(f"regenerate: no report-only command for {', '.join(unknown)} (known: {', '.join(REPORTS)})",
              file=sys.stderr)
        return 2
    environment = os.environ | {"OMP_NUM_THREADS": "1"}
    for name in chosen:
        command = [sys.executable, str(harness.RESULTS / REPORTS[name][0]), *REPORTS[name][1:]]
        print(f"regenerate: {name}", file=sys.stderr, flush=True)
        subprocess.run(command, check=True, env=environment, stdout=subprocess.DEVNULL)
    for name, cost in NOT_REGENERABLE.items():
        print(f"regenerate: {name}.md has no committed summaries (rerunning it: {cost})", file=sys.stderr)
    changed = subprocess.run(["git", "-C", str(harness.ROOT), "status", "--porcelain", "--", "results"],
                             capture_output=True, text=True, check=False).stdout
    print("changed under results/:\n" + changed if changed.strip() else "no report or figure changed",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
