"""The C++ gradient intake (Note [Gradients handed over in C++], csrc/gradient_intake.h), driven
by a real backward pass into a local engine (a world of one): what it takes itself, what it
leaves to Python, and the gradient moves of the overlap runner."""

from __future__ import annotations

import pytest
import torch

from commsched import _C


class Calls:
    def __init__(self) -> None:
        self.first = 0
        self.slow: list[int] = []

    def first_gradient(self, intake: _C.GradientIntake) -> None:
        self.first += 1
        intake.started = True


def engine_for(params: list[torch.Tensor]) -> _C.Engine:
    engine = _C.Engine(None, [f"p{i}" for i in range(len(params))], 10_000)
    engine.install_plan([_C.BlockSpec(block_id=i, op=0, wire_dtype="float32", prescale=1.0,
                                      postscale=1.0,
                                      pieces=[_C.PieceSpec(tensor_id=i, offset=0, numel=p.numel())])
                         for i, p in enumerate(params)])
    return engine


def setup(passes: int = 1) -> tuple[list[torch.Tensor], _C.GradientIntake, _C.Engine, Calls]:
    params = [torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True)]
    calls = Calls()
    intake: _C.GradientIntake = _C.GradientIntake(
        len(params), passes, lambda: calls.first_gradient(intake), calls.slow.append)
    engine = engine_for(params)
    intake.set_engine(engine)
    for tid, p in enumerate(params):
        p.register_post_accumulate_grad_hook(intake.hook(tid))
    return params, intake, engine, calls


def backward(params: list[torch.Tensor]) -> None:
    (params[0].sum(0) * params[1]).sum().backward()


def test_dense_gradients_reach_the_engine_without_python() -> None:
    params, intake, engine, calls = setup()
    for iteration in range(3):
        backward(params)
        assert calls.first == iteration + 1  # once per iteration, before its first gradient
        assert calls.slow == []
        assert [engine.is_ready(t) for t in range(2)] == [True, True]
        assert (intake.handed, intake.marked) == (2, 2)
        engine.wait_all(10_000)
        intake.next_iteration(1)
        for p in params:
            p.grad = None


def test_passes_are_counted_and_only_the_last_is_handed_over() -> None:
    params, intake, engine, calls = setup(passes=2)
    backward(params)
    assert (intake.handed, intake.marked) == (2, 0)
    assert not engine.is_ready(0)
    assert [intake.remaining(t) for t in range(2)] == [1, 1]
    backward(params)  # accumulates into p.grad
    assert (intake.handed, intake.marked) == (4, 2)
    assert engine.is_ready(0) and engine.is_ready(1)
    assert calls.first == 1 and calls.slow == []
    # A third pass is the slow path's (Horovod's AssertionError, raised there).
    backward(params)
    assert calls.slow == [1, 0]


def test_what_the_common_case_does_not_cover_goes_to_python() -> None:
    params, intake, engine, calls = setup()
    intake.set_python_only(1, True)
    # A transposed parameter gets a gradient with its strides: not one contiguous buffer.
    params[0] = torch.randn(4, 3).t().detach().requires_grad_()
    params[0].register_post_accumulate_grad_hook(intake.hook(0))
    backward(params)
    assert params[0].grad is not None and not params[0].grad.is_contiguous()
    assert sorted(calls.slow) == [0, 1]
    assert (intake.handed, intake.marked) == (0, 0)  # the slow path counts what it takes
    assert not engine.is_ready(0) and not engine.is_ready(1)


def test_without_an_engine_every_gradient_goes_to_python() -> None:
    params = [torch.randn(5, requires_grad=True)]
    slow: list[int] = []
    intake = _C.GradientIntake(1, 1, lambda: setattr(intake, "started", True), slow.append)
    params[0].register_post_accumulate_grad_hook(intake.hook(0))
    params[0].sum().backward()
    assert slow == [0]


def test_a_python_error_reaches_backward_as_itself() -> None:
    params = [torch.randn(5, requires_grad=True)]

    def first_gradient() -> None:
        raise AssertionError("the session's own check")

    intake = _C.GradientIntake(1, 1, first_gradient, lambda tid: None)
    params[0].register_post_accumulate_grad_hook(intake.hook(0))
    with pytest.raises(AssertionError, match="the session's own check"):
        params[0].sum().backward()


def test_gradients_move_out_of_and_back_into_p_grad() -> None:
    params = [torch.randn(3, requires_grad=True), torch.randn(2, requires_grad=True)]
    params[0].grad = torch.ones(3)
    taken = _C.take_grads(params)
    assert params[0].grad is None and params[1].grad is None
    assert torch.equal(taken[0], torch.ones(3)) and taken[1] is None
    _C.set_grads(params, [torch.full((3,), 2.0), torch.zeros(2)])
    assert torch.equal(params[0].grad, torch.full((3,), 2.0))
    with pytest.raises(RuntimeError, match="shape"):
        _C.set_grads(params, [torch.zeros(2), torch.zeros(2)])
    _C.clear_grads(params)
    assert params[0].grad is None and params[1].grad is None
