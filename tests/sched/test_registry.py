"""The one policy registry: names, descriptions, and policies built from a name plus options."""

import math

import pytest

from resihp.sched import POLICIES, ResiHP, ResiHPPaper, build_policy
from resihp.sched.base import Policy
from resihp.sched.registry import describe, options_of

ARCHITECTURE_NAMES = (
    "none",
    "checkpoint-restart",
    "recycle",
    "oobleck",
    "greyhound",
    "adaptra",
    "recycle+greyhound",
    "oobleck+greyhound",
    "resihp-paper",
    "resihp",
)  # fmt: skip  (architecture.md §5.2)


def test_every_architecture_name_is_registered_once_with_its_class_name():
    """The registry holds exactly the names of architecture §5.2, each under the class's own
    `name`, each class a Policy whose defaults work and with a one-line description."""
    assert tuple(POLICIES) == ARCHITECTURE_NAMES
    for name, cls in POLICIES.items():
        assert issubclass(cls, Policy) and cls.name == name and cls().name == name
        assert describe(name) and "\n" not in describe(name)


def test_build_policy_checks_every_option():
    """Options become constructor arguments; an unknown option, a wrong type or an unknown name is
    a ValueError naming `policy.KEY`, the value and what is allowed."""
    p = build_policy("resihp", {"horizon_s": 600, "dag_top": 2})
    assert isinstance(p, ResiHP) and p.horizon_s == 600 and p.dag_top == 2
    assert build_policy("resihp", {"horizon_s": math.inf}).horizon_s == math.inf
    paper = build_policy("resihp-paper", {"components": ["DE", "LR"]})  # TOML lists are tuples
    assert isinstance(paper, ResiHPPaper) and paper.components == ("DE", "LR")
    assert "horizon_s" in options_of("resihp") and options_of("none") == {}
    with pytest.raises(
        ValueError, match=r"policy\.horizon: unknown option of policy 'resihp'; allowed: horizon_s"
    ):
        build_policy("resihp", {"horizon": 600})
    with pytest.raises(ValueError, match=r"policy\.horizon_s = '600': must be of type float"):
        build_policy("resihp", {"horizon_s": "600"})
    with pytest.raises(ValueError, match=r"policy\.dag_top = 2\.5: must be of type int"):
        build_policy("resihp", {"dag_top": 2.5})
    with pytest.raises(ValueError, match=r"policy\.delta = True: must be of type int"):
        build_policy("resihp-paper", {"delta": True})
    with pytest.raises(ValueError, match=r"policy\.name = 'malleus': unknown policy; allowed: none, "):
        build_policy("malleus")
    with pytest.raises(ValueError, match=r"policy\.x: unknown option of policy 'none'; allowed: none"):
        build_policy("none", {"x": 1})
    with pytest.raises(ValueError, match=r"policy: components = \('XX',\)"):
        build_policy("resihp-paper", {"components": ["XX"]})
