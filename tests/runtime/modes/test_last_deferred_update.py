"""What an overlap plan still defers after the last step() of a loop: the model's
state_dict() applies it (Note [The last deferred update] in runtime/modes/overlap/runner.py; its
2-rank twin for commsched.shutdown() is in tests/runtime/test_checkpoint_dist.py), and a dropped
optimizer takes its runner's module hooks with it (world of one, before passing through)."""

from __future__ import annotations

import pytest
import torch
from test_update_groups_local import SETTLED, _model
from torch import nn

import commsched


@pytest.mark.parametrize("policy", ["bytescheduler", "dear"])
def test_reading_any_modules_state_dict_applies_the_pending_update(policy: str) -> None:
    # Note [The last deferred update]: a loop that ends with torch.save(model.state_dict())
    # saves the parameters of its last step(), whichever module it reads.
    model, twin = _model(), _model()
    ours = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                          model=model, policy=policy, profile_steps=2,
                                          named_parameters=model.named_parameters())
    plain = torch.optim.SGD(twin.parameters(), lr=0.05)
    runner = ours.session.modes.runner
    assert runner is not None
    ours_layers, twin_layers = ([m for m in net.children() if isinstance(m, nn.Linear)]
                                for net in (model, twin))
    ours_first, ours_last, twin_first, twin_last = (ours_layers[0], ours_layers[-1],
                                                    twin_layers[0], twin_layers[-1])
    deferred = 0
    for step in range(SETTLED + 4):
        for m, o in ((model, ours), (twin, plain)):
            o.zero_grad()
            m(torch.randn(4, 6, generator=torch.Generator().manual_seed(step))).sum().backward()
            o.step()
        if runner.open:  # the profiling steps update at step()
            deferred += 1
            assert not torch.equal(ours_last.weight, twin_last.weight)  # still pending
            assert torch.equal(ours_last.state_dict()["weight"], twin_last.weight)
            assert torch.equal(ours_first.weight, twin_first.weight)  # applied for the last one
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                     twin.state_dict().values(), strict=True))
    assert deferred >= 4
    ours.session.close()
    assert not any(m._state_dict_pre_hooks for m in model.modules())  # close() took them


def test_a_dropped_optimizer_takes_its_runners_hooks_with_it() -> None:
    # Note [a dropped optimizer releases its engine]: left on the model, the runner's pre-hooks
    # and state-dict hooks would wait for the stopped engine (an update was pending).
    import gc

    model = _model()
    ours = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                          model=model, policy="bytescheduler", profile_steps=2,
                                          named_parameters=model.named_parameters())
    for step in range(SETTLED + 2):
        ours.zero_grad()
        model(torch.randn(4, 6, generator=torch.Generator().manual_seed(step))).sum().backward()
        ours.step()
    assert ours.session.modes.runner is not None and ours.session.modes.runner.open
    del ours
    gc.collect()
    assert not any(m._forward_pre_hooks or m._forward_hooks or m._state_dict_pre_hooks
                   for m in model.modules())
    model.state_dict()
    model(torch.randn(4, 6)).sum().backward()
