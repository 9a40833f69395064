"""Distributed K-FAC (SPD-KFAC) on commsched's engine: KFACPreconditioner (docs/kfac.md).

Factors are averaged on the engine as soon as they are computed, fused by the mgwfbp rule;
decompositions are placed on ranks longest-processing-time first.
"""

from .factors import ComputeMethod
from .placement import Assignment, Placement, assign, lpt, makespan, round_robin
from .preconditioner import KFACPreconditioner

__all__ = ["Assignment", "ComputeMethod", "KFACPreconditioner", "Placement", "assign", "lpt",
           "makespan", "round_robin"]
