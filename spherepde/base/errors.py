"""The two ways a run can fail, each with its exit status (docs/design.md "Command line"), and how messages quote text
from files."""


def printable(text: str) -> str:
    """`text` with every character that is not printable (terminal escape sequences, carriage returns, newlines,
    bidirectional overrides) written as its Python escape: text read from a file is shown, never obeyed."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in str(text))


def unreadable(error: Exception) -> str:
    """Why a file could not be opened as a result, for a message: "not a NetCDF file" where no xarray backend
    recognised it (xarray's own words then advise installing engines), else the error's words: an OSError's without
    its "[Errno 2]" and the path it repeats."""
    if "did not find a match" in str(error):
        return "not a NetCDF file"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)


def damaged(error: Exception) -> bool:
    """Whether `error` is the netCDF library's report of bytes it cannot decode (a compressed chunk whose checksum
    fails, a corrupt attribute table): netCDF4 raises RuntimeError or AttributeError with nc_strerror's words, which
    all begin "NetCDF:", and xarray's lazy reads raise it wherever the damaged variable is first read."""
    return isinstance(error, (RuntimeError, AttributeError)) and str(error).startswith("NetCDF:")


class CaseError(ValueError):
    """Bad input: a case key, a value, a file. The message is one line naming the problem.

    The command line turns it into exit status 2 and writes no output file.
    """

    exit_status = 2

    def __init__(self, message: str):
        # Messages quoting other libraries' errors (xarray, netCDF, torch) may span lines: keep one.
        super().__init__(" ".join(line.strip() for line in str(message).splitlines() if line.strip()))


class NumericalFailure(RuntimeError):
    """The numerics broke down (NaN, blow-up, Z <= 0). Exit status 3; the last good state is kept."""

    exit_status = 3

    def __init__(self, message: str, dataset=None):
        super().__init__(message)
        self.dataset = dataset  # the run up to its last good save, written by the command line

    @staticmethod
    def status(message) -> str:
        """The `status` attribute of an output that a failure said by `message` ended: "failed: " and the reason,
        without the "numerical failure: " that begins the message (a training's read "failed: numerical failure:
        ...")."""
        return f"failed: {str(message).removeprefix('numerical failure: ')}"
