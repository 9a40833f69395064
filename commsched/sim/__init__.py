"""What-if simulator: a discrete-event model of training iterations from a profile, a plan and a
network model (docs/simulator.md). Pure Python; `auto` ranks plans with it, and
``python -m commsched simulate`` answers what-if questions with it."""

from .channel import SimEvent
from .network import Algorithm, BulkRateNetwork, FittedNetwork, LinkNetwork, Network
from .profile import (
    BUILTIN_PROFILES,
    ModuleRecord,
    ProfileError,
    RunProfile,
    TensorRecord,
    load_profile,
    profile_from_document,
    ready_profile,
    specs_from_profile,
)
from .rank import Ranked, rank_candidates
from .simulator import Mode, SimResult, simulate

__all__ = [
    "Algorithm", "BUILTIN_PROFILES", "BulkRateNetwork", "FittedNetwork", "LinkNetwork", "Mode",
    "ModuleRecord", "Network", "ProfileError", "Ranked", "RunProfile", "SimEvent", "SimResult",
    "TensorRecord", "load_profile", "profile_from_document", "rank_candidates", "ready_profile",
    "simulate", "specs_from_profile",
]
