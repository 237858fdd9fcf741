"""The one policy registry: name -> class, in the order of architecture §5.2, and how a policy
with options is built from a name and a table of options (the `[policy]` section of a train
config, `resihp simulate --policy`). The CLI, the simulator, the runtime and the benchmarks all
ask it; a new policy is one module plus one line here.
"""

from __future__ import annotations

import inspect

from .base import Policy
from .baselines import (
    Adaptra,
    CheckpointRestart,
    Greyhound,
    NoMitigation,
    Oobleck,
    ReCycle,
    StrengthenedOobleck,
    StrengthenedReCycle,
)
from .ours import ResiHP
from .paper import ResiHPPaper

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        NoMitigation, CheckpointRestart, ReCycle, Oobleck, Greyhound, Adaptra,
        StrengthenedReCycle, StrengthenedOobleck, ResiHPPaper, ResiHP,
    )
}  # fmt: skip


def check_name(name: object, key: str = "policy") -> str:
    """`name` if it is registered; ValueError naming `key`, the value and the allowed names."""
    if not isinstance(name, str) or name not in POLICIES:
        raise ValueError(f"{key} = {name!r}: unknown policy; allowed: {', '.join(POLICIES)}")
    return name


def options_of(name: str) -> dict[str, object]:
    """A policy's options and their defaults (its constructor's keyword arguments)."""
    params = inspect.signature(POLICIES[check_name(name)].__init__).parameters
    return {k: p.default for k, p in params.items() if k != "self" and p.default is not p.empty}


def build_policy(name: str, options: dict | None = None, where: str = "policy") -> Policy:
    """`POLICIES[name](**options)`, every option checked first: an unknown one, or a value of
    another type than its default's, raises ValueError naming `where.KEY`, the value and what is
    allowed (`_checked`)."""
    check_name(name, f"{where}.name")
    allowed = options_of(name)
    kwargs = {}
    for key, value in (options or {}).items():
        if key not in allowed:
            names = ", ".join(allowed) or "none"
            raise ValueError(f"{where}.{key}: unknown option of policy {name!r}; allowed: {names}")
        kwargs[key] = _checked(f"{where}.{key}", value, allowed[key])
    try:
        return POLICIES[name](**kwargs)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _checked(key: str, value, default):
    """`value` for an option whose default is `default`: the same type (an int is a float, a list
    a tuple, as TOML has no tuples; a default None takes any value)."""
    if default is None:
        return value
    if isinstance(default, bool) or not isinstance(default, int | float | tuple):
        ok = isinstance(value, type(default))
    elif isinstance(default, tuple):
        ok, value = isinstance(value, list | tuple), tuple(value) if isinstance(value, list) else value
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and (isinstance(default, float) or isinstance(value, int))
    if not ok:
        raise ValueError(
            f"{key} = {value!r}: must be of type {type(default).__name__}, like its default {default!r}"
        )
    return value


def describe(name: str) -> str:
    """The first line of the policy class's docstring."""
    doc = inspect.getdoc(POLICIES[check_name(name)]) or ""
    return doc.splitlines()[0] if doc else ""
