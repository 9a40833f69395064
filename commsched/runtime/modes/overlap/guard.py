"""The overlap runner's guard of its one invariant: no forward pass reads a parameter whose
update is still pending (Note [No forward pass on a pending update])."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection

# Note [No forward pass on a pending update]
# An overlap plan applies each update in the forward pre-hook of the first module that uses its
# parameters. A hook is not a guarantee that the update lands before the parameter is read:
# * `model=` need not be what the loop calls (a container whose inner network it calls, a
#   LightningModule whose training_step calls self.net, an fx GraphModule): where its root
#   never ran in the profiling steps, the leading group keeps its own modules' hooks (Note [The
#   leading group runs at the root] in overlap/layout.py);
# * torch.compile reuses a graph traced while a module had no hooks: dynamo does not guard on
#   module hooks unless told to (torch_compat.guard_module_hooks, set before an overlap plan's
#   hooks go in);
# * some paths run no Python module hook at all (torch.jit.trace's or torch.jit.script's
#   module, a copy of the model with the same parameters), or read a parameter without its
#   module (F.linear(x, self.head.weight)).
# So the runner checks, rather than trusts, that its hooks run:
# * Before a plan defers anything (activate()): every tensor that got a gradient in a recorded
#   iteration must have a first user whose hooks ran in those forward passes. A tensor without
#   one would be read one update old in every iteration: the runner then applies every update at
#   step() (`updates_at_step`), as a synchronous plan does, and warns naming its module. The
#   collectives stay the plan's, in the plan's order, so this is a rank's own choice: ranks that
#   decide otherwise still run the same blocks.
# * In every iteration after: what a forward pass left pending when it ended (the root's
#   end-of-forward hook, or the first gradient of backward, closes the iteration with finish())
#   is noted as late, and its update waits for step(): applied in place at the first gradient,
#   it would change a value that backward still needs (autograd's "modified by an inplace
#   operation"). A late tensor that then gets a gradient was read before its update: that
#   iteration's gradients were computed one update late for it; the runner warns, naming its
#   module, and applies every update at step() from then on. Nothing is noted in the common
#   case, where every group was applied by its hooks: the check costs no call per iteration.


class PendingReadGuard:
    """Held by an OverlapRunner: what the recorded iterations showed, and what a forward pass
    left pending (Note [No forward pass on a pending update])."""

    def __init__(self, owner_of: dict[int, str], tensors: int, mid_iteration: bool) -> None:
        self._owner_of = owner_of  # tensor id -> the module holding it, for the messages
        self._tensors = tensors
        # Whether the runner was made after its first iteration's forward pass (an elastic job
        # binds at the first gradient): that iteration's gradients say nothing of its hooks.
        self._skip = mid_iteration
        self.policy = ""  # the running plan's, for the messages
        self.recording = True  # whether the runner records its iterations (profiling steps)
        # Tensor ids that got a gradient in an iteration the runner recorded (profiling steps).
        self.with_gradient: set[int] = set()
        # Tensor ids a forward pass left pending when it ended, this iteration.
        self.late: list[int] = []
        # Whether step() applies every update (a path bypasses the hooks): set once, kept.
        self.updates_at_step = False
        # The runner's slots of `late`: their update waits until backward is over (hold()).
        self.held: list[int] = []

    def after_backward(self, received: Callable[[int], bool], iteration: int) -> None:
        """At step(), before the gradients still missing are handed over as zeros: which tensors
        got one (`received`), in a recorded iteration, or among what the forward pass left late."""
        if self._skip:
            self._skip = False
        elif self.recording:
            self.with_gradient.update(t for t in range(self._tensors) if received(t))
        elif self.late:
            self.check_iteration(received, iteration)

    def check_plan(self, first_user: dict[int, str], ran: Collection[str]) -> None:
        """Before a plan defers updates: every tensor with a gradient needs a first user whose
        hooks ran in the recorded forward passes (`ran`)."""
        unhooked = sorted(t for t in self.with_gradient
                          if first_user.get(t) is None or first_user[t] not in ran)
        if unhooked and not self.updates_at_step:
            self.updates_at_step = True
            warnings.warn(
                f"commsched: the forward pass reads parameters of {self._modules(unhooked)} "
                "without running their module's forward pre-hooks (a traced or scripted "
                "module, a copy of the model, or parameters read without their module), so "
                f"policy '{self.policy}' cannot apply their updates before their first use; "
                "step() applies every update from now on (gradients still overlap backward). "
                "Pass the module the training loop calls as model= to keep the overlap "
                "(docs/policies.md, \"Which forward passes\")", RuntimeWarning, stacklevel=2)

    def hold(self, slots: list[int], taken_ids: list[int]) -> None:
        """What a forward pass left pending as it ended (slots of the runner's layout, whose
        tensor ids `taken_ids` gives): late, and held until backward is over."""
        self.late.extend(taken_ids[s] for s in slots)
        self.held = slots

    def take_held(self) -> list[int]:
        """The slots held back, to apply now (step(), or a finish after backward)."""
        held, self.held = self.held, []
        return held

    def check_iteration(self, received: Callable[[int], bool], iteration: int) -> None:
        """At step(): whether a tensor left pending by the forward pass got a gradient."""
        read = sorted({t for t in self.late if received(t)})
        self.late = []
        if read and not self.updates_at_step:
            self.updates_at_step = True
            warnings.warn(
                f"commsched: the forward pass of iteration {iteration} read parameters of "
                f"{self._modules(read)} before their pending update was applied: their "
                "module's forward pre-hooks did not run (a traced or scripted module, a copy "
                "of the model, a compiled graph without hooks, or parameters read without "
                "their module). That iteration's gradients of them were computed one update "
                f"late; under policy '{self.policy}' step() applies every update from now "
                "on. Pass the module the training loop calls as model= to keep the overlap "
                "(docs/policies.md, \"Which forward passes\")", RuntimeWarning, stacklevel=2)

    def _modules(self, tensor_ids: list[int]) -> str:
        names = sorted({self._owner_of.get(t, "?") or "<root>" for t in tensor_ids})
        shown = ", ".join(f"'{n}'" for n in names[:5])
        return f"module {shown}" if len(names) == 1 else \
            f"modules {shown}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")
