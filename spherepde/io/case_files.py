"""The files a case names, checked as it is resolved: the case file must be a regular file, and initial.path an
earlier output whose bytes initial.sha256 pins, whose time axis initial.time indexes, and whose density is
negative by no more than round-off.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import numpy as np
import xarray as xr

from spherepde.base.digest import file_sha256
from spherepde.base.errors import CaseError
from spherepde.io.case_values import Invalid, integer, shortened, text


def regular_file_problem(path: Path, limit: int | None = None) -> str | None:
    """Why `path` is no file to read (not a regular file, or larger than `limit` bytes), or None; OSError when it
    cannot be looked at (missing, no access)."""
    status = os.stat(path)
    if not stat.S_ISREG(status.st_mode):
        kind = "a folder" if stat.S_ISDIR(status.st_mode) else "a device, a pipe or a socket"
        return f"is {kind}, not a regular file"
    if limit is not None and status.st_size > limit:
        return f"is larger than {limit >> 20} MiB ({status.st_size} bytes)"
    return None


def readable_file(value, ctx) -> str:
    """A path, made absolute from the case's directory; the file must be readable."""
    path = Path(os.path.abspath(ctx.inputs.base_dir / Path(text(value, ctx)).expanduser()))
    try:
        problem = regular_file_problem(path)
        if problem:
            raise Invalid(f"{str(path)!r} {problem} (an earlier output is one)")
        with open(path, "rb"):
            pass
    except OSError as error:
        raise Invalid(f"cannot read {str(path)!r}: {error.strerror}") from None
    except ValueError as error:  # a NUL character in the path
        raise Invalid(f"cannot read {str(path)!r}: {error}") from None
    return str(path)


def initial_file_digest(ctx) -> str:
    try:
        return file_sha256(ctx.section["path"])
    except OSError as error:
        raise CaseError(f"initial.path: cannot read {ctx.section['path']!r}: {error.strerror}") from None


def time_index(value, ctx) -> int:
    """An index into the initial file's time axis (negative from its end), checked against that axis's length
    when the file is a readable NetCDF file (otherwise initial.path's own check names the problem)."""
    index = integer()(value, ctx)
    try:
        with xr.open_dataset(ctx.section["path"]) as stored:
            saves = stored.sizes.get("time")
    except Exception:  # not NetCDF: reported when the density is read
        return index
    if saves is not None and not -saves <= index < saves:
        raise Invalid(f"{index} is out of range for the {saves} saves of {ctx.section['path']!r} "
                       f"(use {-saves} .. {saves - 1})")
    return index


def pinned_digest(value, ctx) -> str:
    """A given initial.sha256 must be the file's: the file changed since the case was written otherwise."""
    given = text(value, ctx).strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", given):
        raise Invalid(f"expected 64 hexadecimal digits, got {shortened(value)!r}")
    actual = initial_file_digest(ctx)
    if given != actual:
        raise Invalid(f"{ctx.section['path']!r} has SHA-256 {actual}, not {given}: the file changed since this "
                       "case was written (restore it, or drop initial.sha256 to accept the new file)")
    return given


# Largest fraction of an initial file's mass that its density may hold in negative values: a density resolved by
# its grid undershoots by far less (round-off, tails below diagnostics.tail_tol); more makes no probability
# density, and the run from it would end in a numerical failure (Z <= 0, a blow-up) instead of naming the file.
NEGATIVE_MASS_TOLERANCE = 1e-3


def negative_part(initial: dict) -> str | None:
    """Why the density an initial.kind = "file" case starts from has large negative parts, or None (also when it
    cannot be read here: initial.density_from_file names that problem)."""
    try:
        with xr.open_dataset(initial["path"]) as stored:
            density = stored["density"].isel(time=initial["time"]).values.astype(float)
            area = np.broadcast_to(stored["cell_area"].values.astype(float), density.shape)
    except Exception:  # not a result with a density: reported when the density is read
        return None
    if not np.isfinite(density).all():
        return None
    negative, total = float(area.ravel() @ np.maximum(-density, 0).ravel()), float(area.ravel() @ density.ravel())
    if not negative <= NEGATIVE_MASS_TOLERANCE * abs(total):
        return (f"the density at initial.time = {initial['time']} of {initial['path']!r} is negative where it holds "
                f"{negative:.3g} of its mass {total:.6g} (min {density.min():.3g}; at most {NEGATIVE_MASS_TOLERANCE:g} "
                "relative): not a probability density")
    return None
