"""Command line (DESIGN §7).  Exit status: 0 success, 2 bad input, 3 numerical failure."""

import argparse
import os
import sys
import warnings

from .errors import CaseError, NumericalFailure


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message):
        raise CaseError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="spherepde", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="run a case file, write a NetCDF result")
    run.add_argument("case", help="case file (TOML)")
    run.add_argument("-o", "--output", help="output NetCDF (default: <case name>.nc)")
    run.add_argument("--solver", choices=["eulerian", "particles", "both"], help="overrides solver.method")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], help="overrides solver.device")
    run.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                     help="override a case key (value parsed as TOML); repeatable")
    run.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    run.add_argument("--plot", action="store_true", help="also write the figure <output>.png")
    run.add_argument("--quiet", action="store_true", help="no progress output")

    info = commands.add_parser("info", help="summarise a result file")
    info.add_argument("result")

    plot = commands.add_parser("plot", help="figures of a result file")
    plot.add_argument("result")
    plot.add_argument("-o", "--output", help="folder for the figures (default: beside the result)")
    return parser


def command_run(args) -> int:
    from . import load_case, run
    from .output import write_dataset

    overrides = list(args.set)
    if args.solver:
        overrides.append(f"solver.method={args.solver}")
    if args.device:
        overrides.append(f"solver.device={args.device}")
    case = load_case(args.case, overrides)
    output = args.output or f"{case.name}.nc"
    if os.path.exists(output) and not args.overwrite:
        raise CaseError(f"output {output!r} exists; pass --overwrite to replace it or -o to choose another file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            dataset = run(case, progress=False if args.quiet else None)
    except NumericalFailure as failure:
        if failure.dataset is not None:
            write_dataset(failure.dataset, output)
        raise
    write_dataset(dataset, output)
    for note in filter(None, dataset.attrs.get("notes", "").splitlines()):
        print(f"spherepde: warning: {note}", file=sys.stderr)
    print(f"spherepde: wrote {output}", file=sys.stderr)
    if args.plot:
        from .plotting import plot_result

        for path in plot_result(output):
            print(f"spherepde: wrote {path}", file=sys.stderr)
    return 0


def command_info(args) -> int:
    from .summary import describe

    print(describe(args.result))
    return 0


def command_plot(args) -> int:
    from .plotting import plot_result

    for path in plot_result(args.result, args.output):
        print(f"spherepde: wrote {path}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return {"run": command_run, "info": command_info, "plot": command_plot}[args.command](args)
    except (CaseError, NumericalFailure) as error:
        print(f"spherepde: error: {error}", file=sys.stderr)
        return error.exit_status
    except KeyboardInterrupt:
        print("spherepde: interrupted", file=sys.stderr)
        return 130
