"""The results harness: a run's specification, its digest-named summary, running what is missing, tables.

A study (results/<study>.py) is a plan and a report.  The plan is a list of `Spec`: a key and the resolved cases
of its members (one run, or the members of one batch).  Each spec's summary, everything the report reads, is
committed at

    results/<study>/runs/<key>-<digest>.<suffix>        digest = sha256 of the members' case texts, 10 hex digits

so a spec whose cases change is a new summary, and a report is written from the summaries alone.
`Study.ensure(specs, summarise)` runs the specs that have no summary, the cases of specs that
spherepde.api.ensemble.batches puts together as one batched run (spherepde.api.ensemble.run_batch), and writes what
`summarise(spec, outcomes)` makes of their outcomes, stamped with the commit, the batch's CPU seconds and
the keys of the specs in the batch.  Measurements that are not runs of cases (a convergence
table, a benchmark) are specs without cases, measured by a function of the study.  `table` is the one
markdown-table writer of the reports.

Regenerate every report from the committed summaries: `python3 results/regenerate.py`.
"""

import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
# Where the reports and their figures are written: results/, or the folder $SPHEREPDE_REPORTS names (regenerate.py
# --check writes them there and compares them with the committed ones; the summaries are always read from RESULTS).
REPORTS = Path(os.environ.get("SPHEREPDE_REPORTS") or RESULTS)


@dataclass(frozen=True)
class Spec:
    """One summary's worth of runs: `key` names it, `cases` are its members' resolved cases (spherepde.io.case.Case),
    empty for a measurement that is not a run of cases (its `key` and `parameters` then name what it measures)."""

    key: str
    cases: tuple = ()
    parameters: str = ""

    @property
    def digest(self) -> str:
        text = "\n\n".join(case.text for case in self.cases) if self.cases else self.parameters
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    @property
    def name(self) -> str:
        return f"{self.key}-{self.digest}"


def load_cases(case: str, overrides: list, seeds: list | None = None) -> tuple:
    """cases/<case>.toml with `overrides`; one member per particles.seed in `seeds` when given."""
    import spherepde

    path = ROOT / "cases" / f"{case}.toml"
    if seeds is None:
        return (spherepde.load_case(path, list(overrides)),)
    return tuple(spherepde.load_case(path, list(overrides) + [f"particles.seed={seed}"]) for seed in seeds)


def commit(outputs: list) -> str:
    """The commit the plan runs, "-dirty" when tracked files other than `outputs` (the plan's own summaries, report
    and figures, as git pathspecs) differ from it."""
    def git(*arguments):
        return subprocess.run(["git", "-C", str(ROOT), *arguments], capture_output=True, text=True,
                              check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    excluded = [f":!{output}" for output in outputs]
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no", "--", ".", *excluded) else "")


class Study:
    """The committed summaries of one study, results/<name>/runs/ (`root`/<name>/runs/ for a trial elsewhere), as
    JSON (`suffix` ".json"), NetCDF (".nc") or plain text (".txt": a command's printed output, quoted by the report).

    With `keep_outputs` every spec (of one case) runs alone through `spherepde run`, which writes its full output
    to results/<name>/outputs/<spec name>.nc (not committed: the fields on the grid) and checkpoints a long run,
    so that a run interrupted earlier resumes and an output made earlier is summarised, not rerun."""

    def __init__(self, name: str, suffix: str = ".json", keep_outputs: bool = False, root: Path = RESULTS,
                 reports: tuple = ()):
        self.name, self.suffix = name, suffix
        self.reports = (name, *reports)  # the reports (results/<report>.md, <report>_*.png) the study writes
        self.folder = root / name / "runs"
        self.outputs = root / name / "outputs" if keep_outputs else None

    def path(self, spec: Spec) -> Path:
        return self.folder / f"{spec.name}{self.suffix}"

    def has(self, spec: Spec) -> bool:
        return self.path(spec).exists()

    def read(self, spec: Spec):
        """The summary of `spec`: a dict, an xarray.Dataset loaded into memory, or the text."""
        if self.suffix == ".nc":
            import xarray as xr

            return xr.load_dataset(self.path(spec))
        text = self.path(spec).read_text()
        return text if self.suffix == ".txt" else json.loads(text)

    def write(self, spec: Spec, summary) -> None:
        """Write beside the target, then rename: no summary is ever half-written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.path(spec)
        if self.suffix == ".nc":
            from spherepde.io.output import write_dataset

            write_dataset(summary, target)
            return
        temporary = target.with_name(target.name + ".tmp")
        temporary.write_text(summary if self.suffix == ".txt" else json.dumps(summary, separators=(",", ":")) + "\n")
        os.replace(temporary, target)

    def stale(self, specs: list) -> list:
        """Summaries in the folder that no spec of `specs` names (made from cases the plan no longer holds)."""
        wanted = {self.path(spec).name for spec in specs}
        return sorted(path for path in self.folder.glob(f"*{self.suffix}") if path.name not in wanted)

    def complete(self, specs: list, command: str) -> dict:
        """{key: summary} of every spec of `specs`; exits naming those without a summary and the `command` that
        makes them, and names on stderr the summaries of the folder that no spec names."""
        missing = [spec.key for spec in specs if not self.has(spec)]
        if missing:
            raise SystemExit(f"{self.name}: no summary of {', '.join(missing)} (make them: {command})")
        stale = self.stale(specs)
        if stale:
            print(f"{self.name}: summaries the plan no longer names: " + ", ".join(path.name for path in stale),
                  file=sys.stderr)
        return {spec.key: self.read(spec) for spec in specs}

    def ensure(self, specs: list, summarise, workers: int = 1, measure=None) -> None:
        """Run every spec of `specs` without a summary and write `summarise(spec, outcomes)` (outcomes: per member
        its Dataset, NumericalFailure or CaseError, as run_batch returns them); the specs whose cases batch
        together run as one batch, `workers` batches at a time in processes.  `measure(spec)` makes the
        summary of a spec without cases."""
        missing = [spec for spec in specs if not self.has(spec)]
        if not missing:
            return
        made_by = commit([f"results/{self.name}"] + [f"results/{report}{ending}" for report in self.reports
                                                     for ending in (".md", "_*.png")])
        jobs = _groups(missing, alone=self.outputs is not None)
        print(f"{self.name}: {len(missing)} summaries to make in {len(jobs)} runs", file=sys.stderr, flush=True)
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_run_group, group, summarise, measure, self.outputs): group for group in jobs}
            for done, future in enumerate(as_completed(futures), start=1):
                seconds, summaries = future.result()
                keys = [spec.key for spec in futures[future]]
                for spec, summary in zip(futures[future], summaries):
                    self.write(spec, _stamped(summary, made_by, seconds, keys))
                print(f"[{done}/{len(jobs)}] {', '.join(keys)}: {seconds:.0f} CPU s", file=sys.stderr, flush=True)


def measurement_main(argv, description: str, study: Study, specs: list, measure, command: str) -> dict:
    """The command line of a study of measurements (specs without cases): `--only KEY ...` measures those of
    them that have no summary, else all that have none, `--report-only` none, `--workers N` N at a time; returns
    {key: summary} of every spec (Study.complete)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--report-only", action="store_true", help="measure nothing: the report from the summaries")
    parser.add_argument("--only", nargs="+", choices=[spec.key for spec in specs], default=None,
                        help="measure these only (if they have no summary), then the report")
    parser.add_argument("--workers", type=int, default=1, help="measurements at a time, each in its own process")
    args = parser.parse_args(argv)
    if not args.report_only:
        study.ensure([spec for spec in specs if args.only is None or spec.key in args.only], summarise=None,
                     workers=args.workers, measure=measure)
    return study.complete(specs, command)


def _groups(specs: list, alone: bool = False) -> list:
    """Specs whose members batch together (spherepde.api.ensemble.batches of their first members), largest
    first; a spec without cases alone, and every spec when `alone`."""
    from spherepde.api.ensemble import batches

    if alone:
        return [[spec] for spec in specs]
    runs = [spec for spec in specs if spec.cases]
    groups = [[runs[index] for index in group] for group in batches([spec.cases[0] for spec in runs])]
    return sorted(groups, key=len, reverse=True) + [[spec] for spec in specs if not spec.cases]


def _run_group(specs: list, summarise, measure, outputs: Path | None) -> tuple:
    """(CPU seconds, the summaries of `specs`): their cases run as one batch, or `measure` of a spec without cases,
    or, with `outputs`, the one spec's run through `spherepde run` into that folder (CPU seconds of its process)."""
    import warnings

    from spherepde.api.ensemble import run_batch

    start = time.process_time()
    if not specs[0].cases:
        summary = measure(specs[0])
        return time.process_time() - start, [summary]
    if outputs is not None:
        import xarray as xr

        output, seconds = _run_kept(specs[0], outputs)
        return seconds, [summarise(specs[0], [xr.load_dataset(output)])]
    cases = [case for spec in specs for case in spec.cases]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outcomes = run_batch(cases, progress=False)
    summaries, first = [], 0
    for spec in specs:
        summaries.append(summarise(spec, outcomes[first:first + len(spec.cases)]))
        first += len(spec.cases)
    return time.process_time() - start, summaries


def _run_kept(spec: Spec, outputs: Path) -> tuple:
    """(the output file, CPU seconds) of `spherepde run` of the spec's one case, written to `outputs` as
    <spec name>.toml; it resumes from the checkpoint of an interrupted run, and an output there already is kept.
    A run that fails numerically leaves its last good state in the output (status attribute "failed: ...")."""
    import resource

    outputs.mkdir(parents=True, exist_ok=True)
    case_file, output = outputs / f"{spec.name}.toml", outputs / f"{spec.name}.nc"
    if output.exists():
        return output, 0.0
    from solvers.checkpoint import Checkpoint

    case_file.write_text(spec.cases[0].text)
    again = "--resume" if Checkpoint(output).exists() else "--overwrite"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "-m", "spherepde", "run", str(case_file), "-o", str(output), again,
                             "--quiet"], capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not output.exists():
        raise RuntimeError(f"{spec.key}: spherepde run exited {result.returncode}: {result.stderr.strip()[-400:]}")
    return output, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def _stamped(summary, made_by: str, seconds: float, batch: list):
    """The summary with the commit that made it, its batch's CPU seconds and the keys of the specs in that batch
    (a text summary as it was printed)."""
    if isinstance(summary, str):
        return summary
    if isinstance(summary, dict):
        return {"commit": made_by, "cpu_seconds": seconds, "batch": batch} | summary
    summary.attrs["summary_of"] = f"made at commit {made_by} in {seconds:.0f} CPU s, batch {', '.join(batch)}"
    return summary


def dataset_of(outcome):
    """The Dataset of a run_batch outcome: the outcome itself, the last good state of its NumericalFailure, or
    None (a CaseError, or a failure before any state)."""
    return outcome if not isinstance(outcome, Exception) else getattr(outcome, "dataset", None)


def table(header: list, rows: list) -> list:
    """A markdown table's lines: the header, its rule, one line per row (cells as given, str() of each)."""
    def line(cells):
        return "| " + " | ".join(str(cell) for cell in cells) + " |"

    return [line(header), "|" + "---|" * len(header)] + [line(row) for row in rows]
