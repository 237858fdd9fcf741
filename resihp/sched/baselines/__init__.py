"""The competing systems as simulator policies (baselines.md), one module each."""

from .adaptra import Adaptra
from .checkpoint import CheckpointRestart
from .greyhound import Greyhound
from .none import NoMitigation
from .oobleck import Oobleck
from .recycle import ReCycle
from .strengthened import StrengthenedOobleck, StrengthenedReCycle

BASELINES = {
    cls.name: cls
    for cls in (
        NoMitigation,
        CheckpointRestart,
        ReCycle,
        Oobleck,
        Greyhound,
        Adaptra,
        StrengthenedReCycle,
        StrengthenedOobleck,
    )
}

__all__ = ["BASELINES", *(cls.__name__ for cls in BASELINES.values())]
