"""User-named files, checked before anything runs: inputs that must exist and parse, outputs that
must be writable, directories a job will fill.

Every check raises ValueError with one line `WHAT PATH: problem; what is allowed`, WHAT being the
option or key the user wrote (`--config`, `run.faults`, `scenario`, ...), so that a command can
refuse a bad path before it starts any work or process. `write_atomic` replaces a file in one
rename, so that a reader (or a crash) never sees half of it.
"""

from __future__ import annotations

import os
import tempfile
import tomllib


def check_input(path: str, what: str) -> None:
    """`path` is an existing, readable regular file."""
    if not os.path.exists(path):
        raise ValueError(f"{what} {path}: no such file")
    if os.path.isdir(path):
        raise ValueError(f"{what} {path}: is a directory; give a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{what} {path}: not readable (permission denied)")


def read_text(path: str, what: str, kind: str, encoding: str = "utf-8") -> str:
    """The text of the `kind` file (e.g. "TOML") in `path`; ValueError (one line) when it cannot be
    read or is not UTF-8 (`encoding` "utf-8-sig" also drops a byte-order mark)."""
    check_input(path, what)
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{what} {path}: not UTF-8 text (byte {exc.start}); a {kind} file must be UTF-8"
        ) from None


def read_toml(path: str, what: str) -> dict:
    """The TOML document in `path` (UTF-8, as TOML requires)."""
    text = read_text(path, what, "TOML")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{what} {path}: not valid TOML: {exc}") from None


def _parent(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def _probe(directory: str) -> str | None:
    """Why no file can be created in `directory` (None: it can). Permission bits do not tell
    (root passes every `os.access`, /proc and read-only mounts refuse anyway), so try it."""
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".resihp-probe-")
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(name)
    return None


def check_output(path: str, what: str) -> None:
    """A file can be written at `path`: its directory exists and takes new files, and the path is
    not a directory or a file that cannot be written."""
    if os.path.isdir(path):
        raise ValueError(f"{what} {path}: is a directory; give a file name")
    parent = _parent(path)
    if not os.path.isdir(parent):
        raise ValueError(f"{what} {path}: directory {parent} does not exist; create it or write elsewhere")
    why = _probe(parent)
    if why is None and os.path.exists(path):
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))  # opens without changing it
        except OSError as exc:
            why = exc.strerror
    if why is not None:
        raise ValueError(f"{what} {path}: cannot write there ({why}); give a writable place")


def check_outputs(outputs: dict[str, str | None], stdout: tuple[str, ...] = ()) -> None:
    """`check_output` for every {WHAT: path} given (None: not asked for); a WHAT in `stdout` may
    also be '-' (standard output)."""
    for what, path in outputs.items():
        if path is not None and not (path == "-" and what in stdout):
            check_output(path, what)


def check_dir(path: str, what: str) -> None:
    """`path` is a directory a job can fill: an existing one that takes new files, or one that can
    be created (its nearest existing ancestor is a directory that takes new files)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{what} {path}: is a file, not a directory")
    up = os.path.abspath(path)
    while not os.path.exists(up):
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        raise ValueError(f"{what} {path}: {up} is a file, not a directory")
    why = _probe(up)
    if why is not None:
        raise ValueError(f"{what} {path}: cannot write in {up} ({why}); give a writable place")


def write_atomic(path: str, text) -> None:
    """Write `text` (a str or bytes, or an iterable of str pieces written in turn) to `path`
    through a temporary file in the same directory and one rename."""
    tmp = os.path.join(_parent(path), f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb" if isinstance(text, bytes) else "w") as fh:
            for piece in [text] if isinstance(text, (str, bytes)) else text:
                fh.write(piece)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
