"""The competing systems as simulator policies (baselines.md), one module each; registered with
the others in `resihp.sched.registry`."""

from .adaptra import Adaptra
from .checkpoint import CheckpointRestart
from .greyhound import Greyhound
from .none import NoMitigation
from .oobleck import Oobleck
from .recycle import ReCycle
from .strengthened import StrengthenedOobleck, StrengthenedReCycle

__all__ = [
    "Adaptra",
    "CheckpointRestart",
    "Greyhound",
    "NoMitigation",
    "Oobleck",
    "ReCycle",
    "StrengthenedOobleck",
    "StrengthenedReCycle",
]
