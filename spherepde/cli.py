"""Command line (docs/design.md "Command line").  Exit status: 0 success, 2 bad input, 3 numerical failure."""

import argparse
import math
import os
import shlex
import signal
import sys
import warnings

from spherepde.base import interrupts
from spherepde.base.errors import CaseError, NumericalFailure

CHECKPOINT_MINUTES = 5.0  # default wall time between checkpoints of `run`


DESCRIPTION = """Eulerian solver for the mean-field dynamics of Transformer tokens on the sphere: a case file
(TOML) in, a NetCDF result out.  Exit status: 0 success, 2 bad input, 3 numerical failure."""

EXAMPLES = {
    None: """examples:
  spherepde run cases/quickstart.toml -o out/quickstart.nc --plot
  spherepde run cases/kuramoto-s1.toml --solver both --set particles.n=10000 -o out/both.nc
  spherepde compare out/both.nc
  spherepde info out/quickstart.nc
  spherepde sweep cases/kuramoto-s1.toml --param model.eps=0.2,0.4 -o out/eps-sweep""",
    "run": """examples:
  spherepde run cases/quickstart.toml -o out/quickstart.nc --plot
  spherepde run cases/kuramoto-s1.toml --set model.eps=0.4 --set "model.V=[[2,0],[0,2]]"
  spherepde run cases/kuramoto-s2.toml --solver particles --set particles.n=100000 --set particles.replicas=10
  spherepde run CASE.toml -o OUT.nc --resume       # after an interruption (Ctrl-C, a killed job)
every key of a case file, with its default: the docstring of spherepde/io/case_schema.py""",
    "compare": """examples:
  spherepde compare out/both.nc                  # the two halves of a --solver both file
  spherepde compare eulerian.nc particles.nc -o out/report""",
    "info": """example:
  spherepde info out/quickstart.nc""",
    "plot": """examples:
  spherepde plot out/quickstart.nc --projection mollweide --snapshots 6
  spherepde plot out/kuramoto-s1.nc -o figures --animate""",
    "sweep": """examples (needs the sweep extra: pip install 'spherepde[sweep]'):
  spherepde sweep cases/kuramoto-s1.toml --param model.eps=0.2,0.4,0.6 --param model.beta=0,1 --workers 2
  spherepde sweep cases/kuramoto-s1.toml --param model.eps=0.3,0.5 --set 'solver.method="particles"' --seeds 4
  spherepde sweep cases/kuramoto-s1.toml --set 'solver.method="particles"' --seeds 20
  spherepde sweep CASE.toml --param model.eps=0.1,0.2 --scheduler tcp://HOST:8786""",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2 (the subcommand named, no second prefix)."""

    def error(self, message):
        command = self.prog.removeprefix("spherepde").strip()
        raise CaseError(f"{command}: {message}" if command else message)


def _command(commands, name: str, help: str):
    return commands.add_parser(name, help=help, description=help, epilog=EXAMPLES[name],
                               formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    from spherepde import __version__

    parser = _Parser(prog="spherepde", description=DESCRIPTION, epilog=EXAMPLES[None],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"spherepde {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = _command(commands, "run", "run a case file, write a NetCDF result")
    run.add_argument("case", help="case file (TOML)")
    run.add_argument("-o", "--output", help="output NetCDF (default: <case name>.nc)")
    run.add_argument("--solver", choices=["eulerian", "particles", "both"], help="overrides solver.method")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], help="overrides solver.device")
    run.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                     help="override a case key (value parsed as TOML); repeatable")
    again = run.add_mutually_exclusive_group()
    again.add_argument("--overwrite", action="store_true", help="replace an existing output file (and checkpoint)")
    again.add_argument("--resume", action="store_true", help="continue an interrupted run from its checkpoint")
    run.add_argument("--checkpoint-steps", type=_positive(int), metavar="N",
                     help="checkpoint every N steps, a training every N evaluations of J and dJ/dW "
                          "(default: by wall time only)")
    # no default here: a run that keeps no checkpoint refuses the option given, as it refuses --checkpoint-steps
    run.add_argument("--checkpoint-minutes", type=_positive(float), metavar="M",
                     help=f"checkpoint every M minutes of wall time (default {CHECKPOINT_MINUTES:g})")
    run.add_argument("--plot", action="store_true", help="also write the figure <output>.png")
    run.add_argument("--quiet", action="store_true", help="no progress output")

    compare = _command(commands, "compare", "two runs side by side: diagnostics, standard errors, W2(t)")
    compare.add_argument("a", metavar="A.nc", help="a result file (or a --solver both file alone)")
    compare.add_argument("b", metavar="B.nc", nargs="?", help="the other result file")
    compare.add_argument("-o", "--output", metavar="REPORT",
                         help="writes REPORT.nc and REPORT.png (default: <A>_vs_<B> or <A>_compare)")
    compare.add_argument("--k", type=float, default=3.0, help="verdict: agree within k standard errors (3)")
    compare.add_argument("--atol", type=float, default=1e-9, help="verdict: absolute tolerance added (1e-9)")
    compare.add_argument("--atoms", type=int, default=4000,
                         help="W2 above the exact size: atoms of the quantised measures, below 10000 (4000)")
    compare.add_argument("--no-w2", action="store_true", help="skip W2(t) between the two measures")
    compare.add_argument("--overwrite", action="store_true", help="replace existing report files")

    info = _command(commands, "info", "summarise a result file")
    info.add_argument("result", help="a NetCDF file written by spherepde (run, compare or sweep)")

    plot = _command(commands, "plot", "figures of a result file")
    plot.add_argument("result", help="a NetCDF file written by spherepde run (or a sweep.nc)")
    plot.add_argument("-o", "--output", help="folder for the figures (default: beside the result)")
    # no defaults here: plot_result's apply, and an option given for a file whose figure does not use it (an S^1
    # run's --projection, a sweep's --snapshots) is refused, as --animate of a sweep
    plot.add_argument("--projection",
                      help="S^2 maps: 'orthographic' (both hemispheres, the default) or 'mollweide'")
    plot.add_argument("--snapshots", type=_positive(int), metavar="N",
                      help="saves drawn: S^2 density snapshots, S^1 profiles (4)")
    plot.add_argument("--animate", action="store_true", help="also write <result>.gif, one frame per save")

    sweep = _command(commands, "sweep", "run a case for every combination of parameter values (Dask)")
    sweep.add_argument("case", help="case file (TOML)")
    sweep.add_argument("--param", action="append", default=[], metavar="SECTION.KEY=V1,V2,...",
                       help="a swept key and its values (parsed as TOML); repeatable: members are all combinations")
    sweep.add_argument("--seeds", type=_positive(int), default=None, metavar="N",
                       help="N replicates of each combination (of the case alone without --param), particles.seed "
                            "derived from the case seed")
    sweep.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a case key for every member; repeatable")
    sweep.add_argument("-o", "--output", help="folder for the member files and sweep.nc (default: <case name>-sweep)")
    sweep.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask scheduler (default: a local cluster)")
    sweep.add_argument("--workers", type=_positive(int), metavar="N",
                       help="local cluster size (default: one per GPU, else one per core, at most one per member); "
                            "with --scheduler, the workers its batches are shared by (default: those connected)")
    again = sweep.add_mutually_exclusive_group()
    again.add_argument("--overwrite", action="store_true", help="replace existing member files")
    again.add_argument("--resume", action="store_true", help="keep the completed members of an earlier sweep")
    return parser


def _positive(kind):
    """An argparse type: a number of `kind` > 0."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"expected a finite positive {kind.__name__}, got {text!r}")
        return value
    return parse


def override_key(item: str) -> str:
    """The key "section.key" that the override "section.key=value" sets (its parts stripped)."""
    from spherepde.io.case import parse_override

    return ".".join(parse_override(item)[0])


def check_distinct(overrides: list, options: str) -> None:
    """A CaseError where two overrides set one key: the later would replace the earlier without a word."""
    keys = [override_key(item) for item in overrides]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise CaseError(f"{', '.join(repeated)} set more than once by {options}: give each key once")


def command_run(args) -> int:
    if args.output:
        _hold(args.output, before_reading=True)  # a second writer of it is refused at once
    from spherepde import load_case, run
    from spherepde.api.limits import check_memory, oversubscription
    from spherepde.io.output import BOTH_PREFIX, check_file, write_dataset

    overrides = list(args.set)
    if args.solver:
        overrides.append(f"solver.method={args.solver}")
    if args.device:
        overrides.append(f"solver.device={args.device}")
    case = load_case(args.case, overrides)
    check_distinct(overrides, "--set, --solver or --device")
    output = f"{case.name}.nc" if args.output is None else args.output
    check_file(output, "-o")
    if args.plot:
        from spherepde.analysis.plotting import figure_paths

        figure_paths(output)  # the figure must not replace the result
    with case.naming_errors():
        check_memory(case)
    if note := oversubscription(case):
        print(f"spherepde: warning: {note}", file=sys.stderr)
    _hold(output)
    for role, source in (("the case file", args.case), ("initial.path", case["initial"].get("path"))):
        if source and os.path.exists(output) and os.path.samefile(source, output):
            raise CaseError(f"-o {output!r} is {role} of this run; choose another output file")
    checkpoint = _checkpoint(case, output, args)
    previous_handlers = {}
    if checkpoint is not None:  # SIGINT and SIGTERM alike checkpoint at the end of the step, then stop

        def interrupt(signum, frame):
            STOPPED_BY[0] = signum
            checkpoint.interrupt(signum, frame)
        # SIGINT ignored at the start (`cmd &` in a script) stays ignored (main() sets SIGTERM's handler itself)
        previous_handlers = {number: signal.signal(number, interrupt) for number in interrupts.INTERRUPTS
                             if signal.getsignal(number) is not signal.SIG_IGN}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            dataset = run(case, progress=False if args.quiet else None, checkpoint=checkpoint)
        # the output and the checkpoint's removal before an interrupt acts, which then has nothing left to stop
        with interrupts.held(absorbed=True) as late:
            write_dataset(_with_command(dataset, args, output), output)
            if checkpoint is not None:
                _remove_after_output(checkpoint)
    except NumericalFailure as failure:
        # as a finished run's: the output and the checkpoint's removal before an interrupt acts, else the command
        # ended "interrupted" with the output written and the checkpoint of a run that has nothing left to do
        with interrupts.held(absorbed=True) as late:
            if failure.dataset is not None:
                write_dataset(_with_command(failure.dataset, args, output), output)
            if checkpoint is not None:
                checkpoint.remove()  # resuming would fail the same way; the output holds the last good state
        if late:
            _say_late(late, "the output was written; it is complete")
        elif args.plot and failure.dataset is not None:
            _plot(output)  # the last good state, the failure marked: what the user looks at to see what went wrong
        raise
    except KeyboardInterrupt:
        if checkpoint is not None and checkpoint.exists():
            print(f"spherepde: the run is checkpointed ({checkpoint.describe()}); continue it with --resume",
                  file=sys.stderr)
        raise
    finally:
        for number, handler in previous_handlers.items():
            signal.signal(number, handler)
    for key, part in (("notes", ""), (BOTH_PREFIX + "notes", "particles: ")):  # a "both" run's particle half's own
        for note in filter(None, str(dataset.attrs.get(key, "")).splitlines()):
            print(f"spherepde: warning: {part}{note}", file=sys.stderr)
    print(f"spherepde: wrote {output}", file=sys.stderr)
    if late:
        _say_late(late, "the output was written; it is complete, and the command ends here")
        return 0
    if args.plot:
        _plot(output)
    return 0


def _plot(output: str) -> None:
    """`run --plot`: the figure of the result file `output`."""
    from spherepde.analysis.plotting import plot_result

    for path in plot_result(output):
        print(f"spherepde: wrote {path}", file=sys.stderr)


def _remove_after_output(checkpoint) -> None:
    """Remove the checkpoint of a run whose output is written; a checkpoint that cannot be removed (its folder made
    read-only meanwhile) is a warning: the output is complete, and the command succeeded."""
    try:
        checkpoint.remove()
    except OSError as error:
        print(f"spherepde: warning: the output is complete, but its checkpoint {checkpoint.folder!r} could not be "
              f"removed ({error.strerror or error}); remove it by hand", file=sys.stderr)


def _hold(output: str, before_reading: bool = False) -> None:
    """Hold the lock of `output` (and its checkpoint) for the rest of the command: one writer per output
    (spherepde.io.locking); its folder is made for the lock file if missing.  `before_reading`: the attempt made
    before the case is read (and xarray imported), skipped where no lock file can be made (check_file names why)."""
    from spherepde.io.locking import hold_output

    folder = os.path.dirname(os.path.abspath(output))
    if before_reading:
        if os.path.isdir(folder):
            try:
                hold_output(output)
            except OSError:
                pass
        return
    from spherepde.io.output import make_folders

    make_folders(folder)
    hold_output(output)


def _with_command(dataset, args, output: str):
    """`dataset` with the run's arguments appended to its `history` (CF: the commands that made the file)."""
    words = [args.case, "-o", output] + [word for value in args.set for word in ("--set", value)]
    words += [word for flag, value in (("--solver", args.solver), ("--device", args.device)) if value
              for word in (flag, value)]
    # a NetCDF attribute is UTF-8: bytes of the command line that are not (a Latin-1 file name, which Python holds as
    # lone surrogates) are written as their \xNN escapes, where they failed the output's write after the whole run
    line = shlex.join(map(str, words)).encode(errors="surrogateescape").decode(errors="backslashreplace")
    dataset.attrs["history"] = f"{dataset.attrs.get('history', '')} {line}".strip()
    return dataset


def command_compare(args) -> int:
    from spherepde.analysis.compare import check_options, compare, default_stem, load_pair, report_stem, write_report
    from spherepde.io.output import check_file

    check_options(args.k, args.atol, args.atoms)  # before the files are read
    stem = report_stem(default_stem(args.a, args.b) if args.output is None else args.output)
    if not os.path.basename(stem):
        raise CaseError(f"compare -o: {args.output!r} names a folder; give a file stem such as {args.output}report")
    for path in (f"{stem}.nc", f"{stem}.png"):
        check_file(path, "compare -o")
        if any(os.path.realpath(path) == os.path.realpath(run) for run in (args.a, args.b) if run):
            raise CaseError(f"compare -o: {path!r} is one of the runs compared; choose another name")
    existing = [path for path in (f"{stem}.nc", f"{stem}.png") if os.path.exists(path)]
    if existing and not args.overwrite:
        raise CaseError(f"output {existing[0]!r} exists; pass --overwrite to replace it or -o to choose another name")
    a, b, label_a, label_b = load_pair(args.a, args.b)
    report = compare(a, b, k=args.k, atol=args.atol, atoms=args.atoms, labels=(label_a, label_b), w2=not args.no_w2)
    words = [args.a] + ([args.b] if args.b else []) + ["-o", stem, "--k", args.k, "--atol", args.atol,
                                                       "--atoms", args.atoms] + (["--no-w2"] if args.no_w2 else [])
    report.attrs["history"] += " " + shlex.join(map(str, words))
    print(report.attrs["report"])
    for path in write_report(report, stem):
        print(f"spherepde: wrote {path}", file=sys.stderr)
    return 0


def _not_checkpointed(case) -> str | None:
    """Why a run of `case` keeps no checkpoint, or None when it keeps one."""
    if case["solver"]["method"] != "particles":
        return None
    if not case["control"]:
        return "particle runs are not checkpointed (a rerun reproduces them bit for bit)"
    if case["control"]["noise"] != "common":
        return "a particle training on fresh noise is not checkpointed (its draws depend on the evaluations before)"
    return None


def _checkpoint(case, output: str, args):
    """The run's Checkpoint (None for particle runs, which a rerun reproduces, and particle trainings on fresh
    noise), after checking that an existing output or checkpoint is replaced or resumed only when asked to."""
    from solvers.checkpoint import Checkpoint

    unsaved = _not_checkpointed(case)
    if unsaved is not None:
        for flag, given in (("--resume", args.resume), ("--checkpoint-steps", args.checkpoint_steps is not None),
                            ("--checkpoint-minutes", args.checkpoint_minutes is not None)):
            if given:
                raise CaseError(f"{flag}: {unsaved}")
        checkpoint = None
    else:
        minutes = CHECKPOINT_MINUTES if args.checkpoint_minutes is None else args.checkpoint_minutes
        checkpoint = Checkpoint(output, args.checkpoint_steps, minutes, resume=args.resume)
        if os.path.lexists(checkpoint.folder) and not os.path.isdir(checkpoint.folder):
            raise CaseError(f"{checkpoint.folder!r} exists and is not a folder: the run keeps its checkpoint "
                            "there; move it away or choose another output file")
        if os.path.isdir(checkpoint.folder):
            # the run writes its checkpoints there (and removes them at the end): found out only at the first one,
            # it lost the steps made until then
            from spherepde.io.output import check_folder

            check_folder(checkpoint.folder, "the checkpoint folder")
    stored = checkpoint is not None and checkpoint.exists()
    if args.resume:
        if not stored:
            what = ("; the output exists: pass --overwrite to run again" if os.path.exists(output) else
                    " (a run stopped before its first checkpoint keeps none): run without --resume")
            raise CaseError(f"--resume: no checkpoint {checkpoint.folder!r} to resume from{what}")
        checkpoint.verify(case)
        print(f"spherepde: resuming {output} ({checkpoint.describe()})", file=sys.stderr)
        return checkpoint
    if stored and not args.overwrite:
        raise CaseError(f"output {output!r} has the checkpoint of an interrupted run ({checkpoint.describe()}); "
                        "pass --resume to continue it or --overwrite to start again")
    if os.path.exists(output) and not args.overwrite:
        raise CaseError(f"output {output!r} exists; pass --overwrite to replace it or -o to choose another file")
    if checkpoint is not None:
        checkpoint.remove()  # a fresh run: no stale segments
    return checkpoint


def command_info(args) -> int:
    from spherepde.io.summary import describe

    print(describe(args.result))
    return 0


def command_plot(args) -> int:
    from spherepde.analysis.plotting import plot_result

    for path in plot_result(args.result, args.output, args.projection, args.animate, args.snapshots):
        print(f"spherepde: wrote {path}", file=sys.stderr)
    return 0


def command_sweep(args) -> int:
    import importlib.util

    from spherepde.api.limits import check_seeds

    check_seeds(args.seeds)  # before anything is imported or derived
    if importlib.util.find_spec("distributed") is None:
        raise CaseError("sweep needs the optional Dask packages: pip install 'spherepde[sweep]' "
                        "(or bash scripts/setup.sh test)")
    from spherepde import load_case
    from spherepde.api.sweep import COMBINED, parse_param, run_sweep
    from spherepde.io.output import check_folder

    if not args.param and not args.seeds:
        raise CaseError("sweep: nothing to sweep: give --param SECTION.KEY=V1,V2,... (the values), --seeds N "
                        "(replicates of a particle case), or both")
    case = load_case(args.case, args.set)
    check_distinct(args.set, "--set")
    swept = {parse_param(item)[0] for item in args.param} & {override_key(item) for item in args.set}
    if swept:
        raise CaseError(f"{', '.join(sorted(swept))} both swept by --param and set by --set: the sweep would take "
                        "--param's values alone; give it once")
    folder = f"{case.name}-sweep" if args.output is None else args.output
    check_folder(folder, "sweep -o")
    _hold(os.path.join(folder, COMBINED))
    words = ([args.case, "-o", folder] + [word for value in args.set for word in ("--set", value)]
             + [word for value in args.param for word in ("--param", value)]
             + [word for flag, value in (("--seeds", args.seeds), ("--workers", args.workers),
                                         ("--scheduler", args.scheduler)) if value for word in (flag, value)])
    # an interrupt ends it saying whether --resume has members to keep (run_sweep)
    path = run_sweep(case, args.param, folder, seeds=args.seeds, scheduler=args.scheduler, workers=args.workers,
                     overwrite=args.overwrite, resume=args.resume, command="sweep " + shlex.join(map(str, words)))
    print(f"spherepde: wrote {path}", file=sys.stderr)
    return 0


# The signal of spherepde.base.interrupts.INTERRUPTS that stopped the command, with its finally blocks run (the
# lock file removed, a run checkpointed): the exit status is 128 + it.
STOPPED_BY = [signal.SIGINT]


def _stop(signum, frame) -> None:
    STOPPED_BY[0] = signum
    raise KeyboardInterrupt


def main(argv=None) -> int:
    """Run the command `argv`, by default this process's own command line (the `spherepde` script, `python -m
    spherepde`), in which case dask is hidden from it unless the command is `sweep` (`_hide_dask`)."""
    if argv is None:
        _hide_dask(sys.argv[1:])
        _open_closed_streams()
    status = 1  # an exception that escapes is a failure too
    STOPPED_BY[0] = signal.SIGINT
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        status = _dispatch(argv)
        return status
    finally:
        signal.signal(signal.SIGTERM, previous)
        from spherepde.io.locking import release_all

        # the command has ended (its output written, or it stopped): a signal now finds nothing to stop, and one
        # acted on here broke the clean-up (a traceback, the lock file and the folders made left behind)
        with interrupts.held(absorbed=True) as late:
            release_all()
            if "spherepde.io.output" in sys.modules:  # only it makes folders
                sys.modules["spherepde.io.output"].settle_made_folders(failed=status != 0)
        if late:
            _say_late(late, "the command ended; its exit status stands")
        _forget_escaped_interrupt()
        if argv is None:
            _ignore_late_signals()


def _say_late(late: list, when: str) -> None:
    """The line saying that a signal held off (`interrupts.held`, its numbers in `late`) came as `when`."""
    print(f"spherepde: {signal.Signals(late[0]).name} came as {when}", file=sys.stderr)


def _ignore_late_signals() -> None:
    """SIGINT and SIGTERM ignored for the rest of a process of our own: its command has ended and its exit status
    stands, while the interpreter's shutdown (torch's and xarray's teardown, 0.4-1.4 s measured) still runs, in which
    a signal killed the process (exit status -2 or -15 after a complete output).  SIGKILL still stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _hide_dask(words: list[str]) -> None:
    """Make dask look absent to a process whose command is not `sweep`, the only one that uses it.  Wherever dask
    is installed, xarray imports dask.array the first time it makes a Variable (namedarray.pycompat.array_type) and
    distributed when it writes a file (backends.locks.get_dask_scheduler): 0.4 s of CPU (`spherepde info`: 0.9 s).
    A None in sys.modules makes `import dask` raise ImportError and importlib.util.find_spec answer None, xarray's
    tests of whether dask is there; without it xarray reads and writes the same numpy arrays and files.  Only for a
    process of our own: xarray keeps its answer for the rest of the process."""
    command = next((word for word in words if not word.startswith("-")), None)
    if command != "sweep" and "dask" not in sys.modules:
        sys.modules["dask"] = None


def _open_closed_streams() -> None:
    """/dev/null on the standard streams that were closed when the process started (`spherepde run CASE 2>&-`, a
    daemon's job).  Python leaves such a stream None: the progress bar failed on a None sys.stderr (exit status 1, no
    output, the traceback shown nowhere), and the first file opened took the free descriptor, so that what a library
    writes to descriptor 2 went into it.  Only for a process of our own, as `_hide_dask`."""
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(number)
            continue  # a file of the process holds the descriptor since: leave it
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: `number`, the lower ones being open
        if null != number:
            os.dup2(null, number)
            os.close(null)
        setattr(sys, name, open(number, "r" if number == 0 else "w", closefd=False))


def _forget_escaped_interrupt() -> None:
    """Let the exit status stand.  CPython ends its process by SIGINT (status 130), whatever the status it was
    given, once a KeyboardInterrupt has escaped the code of an exec'd string (run_eval_code_obj sets the runtime's
    unhandled_keyboard_interrupt), even one caught further out: scipy's imports exec strings, so a SIGTERM landing
    there (our KeyboardInterrupt) ended the command with 130 instead of 143.  Every exec of a string clears it."""
    exec("pass")


def _dispatch(argv) -> int:
    """The command's exit status (docs/design.md "Command line"), every error of bad input or numerics as one line."""
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # argparse leaves them to the top parser, whose message would not name the command
            raise CaseError(f"{args.command}: unrecognized arguments: {' '.join(unknown)}" if args.command
                            else f"unrecognized arguments: {' '.join(unknown)}")
        if args.command is None:  # bare `spherepde`: the usage and the list of commands
            parser.print_help(sys.stderr)
            return CaseError.exit_status
        return {"run": command_run, "info": command_info, "plot": command_plot,
                "compare": command_compare, "sweep": command_sweep}[args.command](args)
    except (CaseError, NumericalFailure) as error:
        print(f"spherepde: error: {error}", file=sys.stderr)
        return error.exit_status
    except BrokenPipeError:
        # the reader of our stdout stopped (`spherepde info RUN.nc | head`): end as a command killed by SIGPIPE
        # does, silently, with stdout on /dev/null so that the interpreter's final flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as error:  # a file we were told to read or write: the path is the bad input
        print(f"spherepde: error: {error}", file=sys.stderr)
        return CaseError.exit_status
    except (MemoryError, RuntimeError) as error:
        # torch reports a failed allocation as OutOfMemoryError (CUDA) or a RuntimeError naming its allocator.
        if not (isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError"
                or "can't allocate memory" in str(error)):
            raise
        print("spherepde: error: out of memory: the case is too large for this machine (reduce particles.n, "
              "sphere.lmax or solver.chunk, or use a device with more memory)", file=sys.stderr)
        return CaseError.exit_status
    except KeyboardInterrupt:
        print(f"spherepde: {'terminated' if STOPPED_BY[0] == signal.SIGTERM else 'interrupted'}", file=sys.stderr)
        return 128 + STOPPED_BY[0]
