"""The files of a checkpoint, one at a time: each read only if it is a regular file of at most the size its
manifest names, identified by its size and SHA-256, and written atomically (a temporary file beside it, then a
rename); a file a resume must not use is `Refused` with the file named and why.
"""

import hashlib
import os
import uuid


class Refused(Exception):
    """A checkpoint file that a resume must not use: (the file, why)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def data_identity(data: bytes) -> dict:
    return {"bytes": len(data), "sha256": sha256(data)}


def refuse_other_than_regular(path: str) -> None:
    """A refusal where `path` is there and no regular file: looked at before it is opened, since opening a named pipe
    waits for a writer (a resume hung on a segment that was one)."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise Refused(path, "is not a regular file")


def file_identity(path: str) -> dict:
    """{"bytes", "sha256"} of the regular file at `path` (streamed), or a refusal naming it."""
    digest, size = hashlib.sha256(), 0
    refuse_other_than_regular(path)
    try:
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
    except OSError as error:
        raise Refused(path, f"cannot be read: {error.strerror or error}") from None
    return {"bytes": size, "sha256": digest.hexdigest()}


def read_regular(path: str, limit: int) -> bytes:
    """The first limit + 1 bytes of the regular file at `path` (more than `limit`: the file is larger than
    expected), or a refusal naming it."""
    refuse_other_than_regular(path)
    try:
        with open(path, "rb") as stream:
            return stream.read(limit + 1)
    except OSError as error:
        raise Refused(path, f"cannot be read: {error.strerror or error}") from None


def mismatch(size: int, recorded: int) -> str:
    """Why a file of `size` bytes (recorded + 1: more) is not the one of `recorded` bytes its manifest names."""
    if size != recorded:
        shown = f"more than {recorded}" if size > recorded else str(size)
        return (f"does not match the checkpoint's manifest: {shown} bytes, {recorded} when it was written "
                "(truncated, extended or replaced)")
    return "does not match the checkpoint's manifest: its SHA-256 differs (edited or replaced after it was written)"


def write_atomically(path: str, data: bytes) -> None:
    """`data` as the file `path`: a temporary file beside it, then a rename."""
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temporary, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
