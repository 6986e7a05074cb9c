"""Fingerprint the outputs of every case in cases/: a refactoring must leave them bit-identical.

Runs each case through the CLI (float64, CPU, one thread) on a shortened problem (depth at most HORIZON,
lmax at most LMAX, 2 training iterations), then hashes every variable's bytes and, apart from them, its
attributes and the file's, except provenance and timings (history, source, version, commit, *seconds).
Usage:

    OMP_NUM_THREADS=1 python3 scripts/fingerprint_cases.py -o before.json
    OMP_NUM_THREADS=1 python3 scripts/fingerprint_cases.py --compare before.json

The second form exits with status 1 and names each difference.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import netCDF4

ROOT = Path(__file__).resolve().parents[1]
HORIZON = 1.0  # units of depth: enough steps to exercise every operator, short enough for minutes
LMAX = 256  # larger grids are cut to this: the code paths are the same, the cost is not
PROVENANCE = {"history", "source", "version", "commit"}  # and every timing (`*seconds`)
EXTRA_RUNS = {  # the solver modes a case file does not select by itself
    "quickstart-both": ("quickstart", ["--solver", "both", "--set", "particles.n=2000"]),
    "kuramoto-s1-both": ("kuramoto-s1", ["--solver", "both", "--set", "particles.n=2000"]),
}


def overrides(case_file: Path) -> list[str]:
    case = tomllib.loads(case_file.read_text())
    sets = ["--set", f"time.t_end={min(case['time']['t_end'], HORIZON)}", "--set", 'solver.device="cpu"']
    if case["sphere"].get("lmax", 0) > LMAX:
        sets += ["--set", f"sphere.lmax={LMAX}"]
    if case.get("control", {}).get("iterations", 0) > 0:
        sets += ["--set", "control.iterations=2"]
    return sets


def fingerprint(path: Path) -> dict:
    def attrs(item) -> dict:
        return {name: str(item.getncattr(name)) for name in item.ncattrs()
                if name.removeprefix("particles_") not in PROVENANCE and not name.endswith("seconds")}

    def digest(values: dict) -> str:
        return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()

    def walk(group, prefix: str, into: dict):
        into[prefix + "@attrs"] = digest(attrs(group))
        for name, variable in group.variables.items():
            variable.set_auto_maskandscale(False)
            data = variable[...]
            raw = getattr(data, "tobytes", lambda: str(data).encode())()
            into[prefix + name] = hashlib.sha256(raw).hexdigest()
            into[prefix + name + "@attrs"] = digest(attrs(variable))
        for name, child in group.groups.items():
            walk(child, prefix + name + "/", into)
        return into

    with netCDF4.Dataset(path) as dataset:
        return walk(dataset, "", {})


def run_all(only: list[str]) -> dict:
    runs = {path.stem: (path.stem, []) for path in sorted((ROOT / "cases").glob("*.toml"))} | EXTRA_RUNS
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for label, (stem, extra) in runs.items():
            if only and label not in only:
                continue
            case_file = ROOT / "cases" / f"{stem}.toml"
            output = Path(scratch) / f"{label}.nc"
            command = [sys.executable, "-m", "spherepde", "run", str(case_file), "-o", str(output), "--overwrite",
                       *overrides(case_file), *extra]
            done = subprocess.run(command, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
            results[label] = {"exit": done.returncode} | (fingerprint(output) if output.exists() else {})
            print(f"{label}: exit {done.returncode}, {len(results[label]) - 1} entries", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", help="write the fingerprints as JSON")
    parser.add_argument("--compare", help="JSON from an earlier run: report every difference")
    parser.add_argument("--only", nargs="*", default=[], help="run labels to restrict to")
    arguments = parser.parse_args()
    results = run_all(arguments.only)
    if arguments.output:
        Path(arguments.output).write_text(json.dumps(results, indent=1, sort_keys=True))
    if not arguments.compare:
        return 0
    before = json.loads(Path(arguments.compare).read_text())
    differences = [f"{label}: {key}" for label in results
                   for key in sorted(set(results[label]) | set(before.get(label, {})))
                   if results[label].get(key) != before.get(label, {}).get(key)]
    print("\n".join(differences) or f"identical: {len(results)} runs")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
