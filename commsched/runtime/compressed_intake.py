"""A session's side of lossy compression (PowerSGD, top-k): switching compression on at its
start_step (the C++ gradient intake leaves a compressed tensor's gradient to Python, and
Session._slow_path hands it to the compressor; the math and the factor buffers are in
runtime/compressed.py; the wire tensors' place in the plan in plan/compressed.py)."""

from __future__ import annotations

from .compressed import CompressedGradients
from .lifecycle import PlanLifecycle


class CompressedIntake:
    """Mixed into Session, which provides the plan lifecycle and the iteration counter."""

    compressed: CompressedGradients | None
    lifecycle: PlanLifecycle
    iteration: int

    def _compression_switch(self) -> None:
        """Compression starts at its start_step: from then on the plans carry its wire tensors
        (commsched.plan.compressed); the plan in place is rebuilt when it starts mid-run."""
        compressed = self.compressed
        if compressed is None or compressed.on \
                or self.iteration < compressed.lossy.start_step:
            return
        compressed.on = True
        self.lifecycle.compressor = compressed
        if self.iteration > 0:
            self.lifecycle.reinstall(self.iteration)

    def compression_restored(self) -> None:
        """After load_state_dict(): compressing or not as the saved run was at this iteration
        (the restored plan already carries the wire tensors if it was)."""
        compressed = self.compressed
        if compressed is not None and self.iteration >= compressed.lossy.start_step:
            compressed.on = True
            self.lifecycle.compressor = compressed
