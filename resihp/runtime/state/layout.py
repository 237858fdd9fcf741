"""Where a checkpoint's pieces live in `run.checkpoint_dir`, and the torch-free helpers that the
writer (`checkpoint.py`) and the verifier (`verify.py`) share; the layout itself is told in
`checkpoint.py`."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, fields

from resihp.core.model_spec import ModelSpec, RopeScaling

FORMAT = "resihp-dcp-1"
META = "meta.json"  # written last: the commit of a checkpoint
CHECKSUMS = "checksums.json"  # per saver directory: {file: {"bytes", "sha256"}}
LATEST = "latest"
ITER_RE = re.compile(r"iter_(\d{8})$")


def iter_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:08d}")


def iterations(root: str) -> list[int]:
    """The iterations of every `iter_*` directory in `root`, ascending (complete or not)."""
    found = [ITER_RE.match(n) for n in os.listdir(root)] if os.path.isdir(root) else []
    return sorted(int(m.group(1)) for m in found if m and os.path.isdir(os.path.join(root, m.group(0))))


def complete(root: str) -> list[int]:
    """The iterations of the checkpoints in `root` that have their `meta.json`, ascending."""
    return [k for k in iterations(root) if os.path.isfile(os.path.join(iter_dir(root, k), META))]


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_sums(directory: str, names) -> dict[str, dict]:
    """{name: {"bytes", "sha256"}} of the files `names` in `directory`."""
    out = {}
    for n in names:
        p = os.path.join(directory, n)
        out[n] = {"bytes": os.path.getsize(p), "sha256": sha256(p)}
    return out


def write_json(obj, path: str) -> None:
    """`obj` as JSON at `path`, durably and atomically (a temporary name renamed into place)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def spec_to_json(spec: ModelSpec) -> dict:
    return asdict(spec)


def spec_from_json(raw: dict) -> ModelSpec:
    raw = dict(raw)
    if raw.get("rope_scaling") is not None:
        raw["rope_scaling"] = RopeScaling(**raw["rope_scaling"])
    return ModelSpec(**{f.name: raw[f.name] for f in fields(ModelSpec) if f.name in raw})
