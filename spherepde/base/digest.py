"""The SHA-256 of a file's bytes: what pins an initial file to a case (initial.sha256), checked when the case is
resolved and again when the run reads the file."""

import hashlib


def file_sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
