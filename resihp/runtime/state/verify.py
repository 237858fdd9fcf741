"""Which checkpoint `--resume PATH` (and the in-job restart) may load: verified before any member
starts, falling back to the newest complete one.

A checkpoint is usable when its `meta.json` parses, has this format, and every file it lists
exists with the listed size and SHA-256 (`checkpoint.write_meta` lists the DCP data and metadata
of every saver and the merged DCP metadata, whose chunks were checked to tile every tensor when it
was written). So a missing, truncated or corrupt piece — shard, metadata or meta.json — is caught
here, never inside a worker.

`PATH` is a `run.checkpoint_dir` (candidates: its complete `iter_*` checkpoints, newest first) or
one checkpoint (candidates: it, then the older complete ones beside it). The first usable one is
taken; when that is not the first candidate, one warning line says which were skipped and why.
Nothing usable: ValueError, one line. Torch-free.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import fields

from resihp.core.model_spec import ModelSpec

from .layout import FORMAT, ITER_RE, META, complete, iter_dir, sha256, spec_to_json


def _warn(msg: str) -> None:
    print(f"resihp: warning: {msg}", file=sys.stderr)


def verify(path: str) -> dict:
    """The checkpoint's meta (JSON) when every piece is intact; ValueError saying what is not."""
    try:
        with open(os.path.join(path, META)) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"no {META} (an incomplete save)") from None
    except (OSError, ValueError):
        raise ValueError(f"{META} is not valid JSON (truncated or corrupt)") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{META}: not a {FORMAT} checkpoint")
    files = meta.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(w, dict) and {"bytes", "sha256"} <= set(w) for w in files.values()
    ):
        raise ValueError(f"{META}: no valid file list")
    for rel, want in sorted(files.items()):
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            raise ValueError(f"{rel} is missing")
        size = os.path.getsize(full)
        if size != want["bytes"]:
            raise ValueError(f"{rel} has {size} bytes, {want['bytes']} were written (truncated?)")
        if sha256(full) != want["sha256"]:
            raise ValueError(f"{rel} is corrupt (checksum mismatch)")
    return meta


def candidates(path: str, at_most: int | None = None) -> list[str]:
    """The checkpoints `--resume path` may load, in order of preference (see the module doc); with
    `at_most`, only those of iterations <= it (as their directories name them)."""
    path = os.path.normpath(path)
    m = ITER_RE.match(os.path.basename(path))
    if m is None and not os.path.isfile(os.path.join(path, META)):  # a run.checkpoint_dir
        found = [iter_dir(path, k) for k in reversed(complete(path))]
    else:
        root = os.path.dirname(path) or "."
        older = (
            [] if m is None else [iter_dir(root, k) for k in reversed(complete(root)) if k < int(m.group(1))]
        )
        found = [path, *older]
    if at_most is None:
        return found
    return [
        p for p in found if (n := ITER_RE.match(os.path.basename(p))) is None or int(n.group(1)) <= at_most
    ]


def newest_usable(
    path: str, what: str = "--resume", warn: Callable[[str], None] = _warn, at_most: int | None = None
) -> tuple[str, dict]:
    """(checkpoint directory, its meta) to load for `what path` (`at_most`: of an iteration <= it);
    ValueError (one line) when no checkpoint there is usable."""
    skipped = []
    for cand in candidates(path, at_most):
        try:
            meta = verify(cand)
        except ValueError as e:
            skipped.append(f"{os.path.basename(cand)}: {e}")
            continue
        if skipped:
            warn(f"{what} {path}: skipping {'; '.join(skipped)}; resuming from {os.path.basename(cand)} "
                 f"(iteration {meta['iteration']})")  # fmt: skip
        return cand, meta
    why = f" ({'; '.join(skipped)})" if skipped else f" (no {META}, no iter_* directory)"
    raise ValueError(f"{what} {path}: no complete checkpoint{why}")


def check_model(meta: dict, spec: ModelSpec, what: str) -> None:
    """ValueError naming the first field in which the checkpoint's model differs from `spec` (its
    name aside: an imported model and a preset of one shape are the same model)."""
    mine = spec_to_json(spec)
    for f in fields(ModelSpec):
        theirs = meta["model"].get(f.name)
        if f.name != "name" and theirs != mine[f.name]:
            raise ValueError(
                f"{what}: the checkpoint's model has {f.name} = {theirs!r}, the config's model.{f.name} = "
                f"{mine[f.name]!r} (resume with the config that wrote it)"
            )
