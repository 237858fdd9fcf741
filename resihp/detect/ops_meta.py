"""The META file of a per-operation trace (`resihp detect --ops-trace FILE --meta META`): the job's
parallel layout, `dp_size`, `pp_size`, `tp_size`, `world_size` (integers >= 1; other keys ignored).

Two formats, chosen by the file name: `.toml` (read by `resihp.core.files.read_toml`) and
`.yaml` / `.yml`, of which the top-level `key: value` subset is read by `_flat_yaml` below, so that
no YAML library is needed (PyYAML is not a dependency). That subset is what such meta files hold:
plain scalars, optionally quoted, `#` comments, `---` / `...` document markers. Lines indented under
another key (a nested mapping, a list, a block scalar) belong to a key we ignore and are skipped;
a top-level line that is not `key: value` is refused, naming the line.

`world_size` must be a multiple of dp_size × pp_size × tp_size: context parallelism multiplies the
world without changing the work a stage's devices do, so it is allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from resihp.core.files import check_input, read_text, read_toml

META_KEYS = ("dp_size", "pp_size", "tp_size", "world_size")
META_SUFFIXES = (".toml", ".yaml", ".yml")


@dataclass(frozen=True)
class OpsMeta:
    dp_size: int
    pp_size: int
    tp_size: int
    world_size: int


_KEY = re.compile(r"^([A-Za-z_][\w.-]*)\s*:(?:\s+(.*))?$")
_INT = re.compile(r"^[+-]?\d+$")


def _scalar(text: str) -> object:
    """A plain YAML scalar of the subset: int, float, bool, null, or (quoted or not) text."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if _INT.match(text):
        return int(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _strip_comment(text: str) -> str:
    """`text` without a trailing ` # comment` (a `#` inside quotes stays)."""
    quote = None
    for k, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or text[k - 1] in " \t"):
            return text[:k].rstrip()
    return text.rstrip()


def _flat_yaml(text: str, where: str) -> dict:
    out: dict[str, object] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        body = _strip_comment(line)
        if not body.strip() or body.startswith((" ", "\t")) or body == "---":
            continue  # blank, comment, document start, or nested under an (ignored) key
        if body == "...":
            break
        m = _KEY.match(body)
        if m is None:
            raise ValueError(
                f"{where}:{lineno}: {body.strip()[:40]!r}: not a top-level `key: value` line "
                "(the YAML subset read here; or give META as TOML)"
            )
        out[m.group(1)] = _scalar((m.group(2) or "").strip())
    return out


def read_meta(path: str, what: str = "--meta") -> OpsMeta:
    """The layout in `path`; ValueError naming the file, the key, its value and what is allowed."""
    check_input(path, what)
    if not path.lower().endswith(META_SUFFIXES):
        raise ValueError(f"{what} {path}: unknown format; the name must end in {', '.join(META_SUFFIXES)}")
    if path.lower().endswith(".toml"):
        raw = read_toml(path, what)
    else:
        text = read_text(path, what, "YAML", encoding="utf-8-sig")
        raw = _flat_yaml(text, f"{what} {path}")
    values = {}
    for key in META_KEYS:
        if key not in raw:
            raise ValueError(f"{what} {path}: missing key {key!r}; required: {', '.join(META_KEYS)}")
        v = raw[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{what} {path}: {key} = {v!r}: must be an integer >= 1")
        values[key] = v
    meta = OpsMeta(**values)
    cells = meta.dp_size * meta.pp_size * meta.tp_size
    if meta.world_size % cells:
        raise ValueError(
            f"{what} {path}: world_size = {meta.world_size}: must be a multiple of "
            f"dp_size × pp_size × tp_size = {cells}"
        )
    return meta
