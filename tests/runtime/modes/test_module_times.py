"""The forward time the runner records per module (runtime/modes/overlap/module_profile.py): a
module called several times in one forward pass, as torchvision's ResNet blocks call their `relu`,
records the sum of its calls, once per forward pass, and the modules' own times add up to the root's
(Note [A module called several times]); an evaluation between iterations records nothing.
"""

from __future__ import annotations

import statistics

import torch
from torch import nn

import commsched
from commsched.plan import is_profiling_plan

WIDTH = 384


class _Block(nn.Module):
    """One activation module between two wide layers, called three times."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.a(x))
        x = self.relu(self.b(x))
        return self.relu(x + 1)


def test_a_module_called_three_times_records_its_calls_only() -> None:
    commsched.init()
    torch.manual_seed(0)
    model = nn.Sequential(_Block(), _Block(), nn.Linear(WIDTH, 2))
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1e-3), named_parameters=model.named_parameters(),
        model=model, policy="prophet", profile_steps=2)
    opt.session.never_pass_through()  # the path a world with peers takes
    for step in range(20):
        x = torch.randn(256, WIDTH, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    runner = opt.session.modes.runner
    assert runner is not None and opt.session.mode.defers_updates
    times = runner.modules.times
    # One figure per recorded forward pass, as the root's.
    assert len(times["0.relu"]) == len(times[""]) >= 2, times
    # Three element-wise passes against a 384 x 384 matrix product of 256 rows: timed from
    # the first call's start, the relu's later calls would take in the product between them.
    assert statistics.median(times["0.relu"]) < statistics.median(times["0.b"]), times
    # The modules' own times add up to the root's, pass by pass: each one's time less its
    # children's, never below zero. Timed from the first call's start, the relu took in the
    # products between its calls, its block's own time fell to zero and the sum rose by about
    # a third. Per pass, not as medians of different passes: on a busy machine (the suite's
    # other worker) a pass slowed down slows its root and its modules alike.
    def own(name: str, index: int) -> float:
        children = [c for c in times if c != name and c.rpartition(".")[0] == name
                    and (name or "." not in c)]
        return max(0.0, times[name][index] - sum(times[c][index] for c in children))

    ratios = [sum(own(name, i) for name in times) / times[""][i]
              for i in range(len(times[""]))]
    assert statistics.median(ratios) < 1.1, (ratios, times)
    opt.session.close()


def test_an_evaluation_between_iterations_is_not_timed() -> None:
    """A forward pass under torch.no_grad() (an evaluation, at its own batch size) records no
    module times: every forward pass of the profiling steps is timed, the evaluations are not."""
    commsched.init()
    torch.manual_seed(0)
    model = nn.Sequential(_Block(), nn.Linear(WIDTH, 2))
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1e-3), named_parameters=model.named_parameters(),
        model=model, policy="prophet", profile_steps=4)
    runner = opt.session.modes.runner
    assert runner is not None
    for step in range(3):  # profiling steps: every training forward pass is timed
        x = torch.randn(16, WIDTH, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        with torch.no_grad():
            model(torch.randn(512, WIDTH))
    assert is_profiling_plan(opt.plan)
    assert len(runner.modules.times[""]) == 3, runner.modules.times[""]
    opt.session.close()
