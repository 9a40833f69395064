"""The step modes: what step(), synchronize() and an iteration's first gradient do under the
plan in place, one class per mode (Note [A step mode is an object] in base.py)."""

from .base import ModeKind, StepMode
from .choice import StepModes

__all__ = ["ModeKind", "StepMode", "StepModes"]
