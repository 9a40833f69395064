"""Distributed K-FAC (SPD-KFAC): factors averaged on the engine as soon as they are computed,
fused by the mgwfbp rule; decompositions placed on ranks longest-processing-time first."""

from .factors import ComputeMethod
from .placement import Assignment, Placement, assign, lpt, makespan, round_robin
from .preconditioner import KFACPreconditioner

__all__ = ["Assignment", "ComputeMethod", "KFACPreconditioner", "Placement", "assign", "lpt",
           "makespan", "round_robin"]
