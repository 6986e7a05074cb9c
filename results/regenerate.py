"""Every report of results/ from its committed summaries, nothing run:

    python3 results/regenerate.py [STUDY ...]           # rewrite the reports and figures in results/
    python3 results/regenerate.py --check [STUDY ...]   # write them elsewhere; exit 1 if a report differs

calls each study's script with its report-only option (REPORTS), in order, and says which reports and figures
changed (`git status`).  On a checkout whose summaries and code are committed together nothing should change;
`--check` tests exactly that for the markdown reports (the figures' bytes depend on the matplotlib version), with
the reports written to a temporary folder ($SPHEREPDE_REPORTS, harness.REPORTS), so the checkout is not touched.
"""

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import harness

REPORTS = {
    "core_verification": ["core_verification.py", "--report-only"],
    "adjoint_verification": ["adjoint_verification.py", "--report-only"],
    "spectral_verification": ["spectral_verification.py", "--report-only"],
    "particles_verification": ["particles_verification.py", "--report-only"],
    "seed004": ["seed004.py", "--report-only"],
    "seed004_reduced": ["seed004_reduced.py", "--report-only"],
    "paper003": ["paper003.py", "--full", "--report-only"],
    "beyond": ["beyond.py", "--report-only"],
}
# The reports of a study that writes more than its own results/<study>.md.
WRITES = {"seed004_reduced": ["seed004_reduced", "seed004_escape", "seed004_particles", "seed004_candidates",
                              "seed004_readout"]}


def write_reports(chosen: list, folder: Path) -> None:
    """Each chosen study's report (and figures) from its summaries, written to `folder`."""
    environment = os.environ | {"OMP_NUM_THREADS": "1", "SPHEREPDE_REPORTS": str(folder)}
    for name in chosen:
        command = [sys.executable, str(harness.RESULTS / REPORTS[name][0]), *REPORTS[name][1:]]
        print(f"regenerate: {name}", file=sys.stderr, flush=True)
        subprocess.run(command, check=True, env=environment, stdout=subprocess.DEVNULL)


def differences(chosen: list, folder: Path) -> list:
    """(name, the first lines of a unified diff) for each chosen report in `folder` that differs from results/ or
    was not written."""
    found = []
    for name in (report for study in chosen for report in WRITES.get(study, [study])):
        committed, written = harness.RESULTS / f"{name}.md", folder / f"{name}.md"
        if not written.exists():
            found.append((name, ["(not written: its study's script says which summaries are missing)"]))
        elif committed.read_bytes() != written.read_bytes():
            diff = difflib.unified_diff(committed.read_text().splitlines(), written.read_text().splitlines(),
                                        f"results/{name}.md", "regenerated", lineterm="", n=0)
            found.append((name, list(diff)[:12]))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="*", help=f"some of {', '.join(REPORTS)} (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="write the reports to a temporary folder and compare them with results/")
    args = parser.parse_args(argv)
    chosen = args.studies or list(REPORTS)
    unknown = [name for name in chosen if name not in REPORTS]
    if unknown:
        print(f"regenerate: no report-only command for {', '.join(unknown)} (known: {', '.join(REPORTS)})",
              file=sys.stderr)
        return 2
    if args.check:
        with tempfile.TemporaryDirectory() as folder:
            write_reports(chosen, Path(folder))
            found = differences(chosen, Path(folder))
        for name, diff in found:
            print(f"regenerate: results/{name}.md differs from its regenerated report:\n" + "\n".join(diff),
                  file=sys.stderr)
        count = sum(len(WRITES.get(study, [study])) for study in chosen)
        print(f"regenerate: {count - len(found)} of {count} reports identical to their regeneration", file=sys.stderr)
        return 1 if found else 0
    write_reports(chosen, harness.RESULTS)
    changed = subprocess.run(["git", "-C", str(harness.ROOT), "status", "--porcelain", "--", "results"],
                             capture_output=True, text=True, check=False).stdout
    print("changed under results/:\n" + changed if changed.strip() else "no report or figure changed",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
