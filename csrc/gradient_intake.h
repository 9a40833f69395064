// Hands each parameter's finished gradient to the engine from a post-accumulate-grad hook that
// is a C++ object: torch calls it as it calls a Python hook, but no Python frame runs.
//
// Note [Gradients handed over in C++]
// A hook written in Python costs its frame and the Python it runs on every gradient: measured on
// the built-in MLP (6 parameters, 0.7 ms per iteration on one core) about 4 us per gradient, 3%
// of the iteration, where an empty hook costs 0.6 us; GPT-2 has 148 parameters. So the common
// case runs here: a dense, contiguous gradient of a tensor the plan carries is counted
// (backward_passes_per_step) and handed to the engine. Python runs once per iteration before its
// first gradient (the session's once-per-iteration work, Session.first_gradient; an elastic job
// binds its engine there), and for what the common case does not cover, in the slow path, which
// does what the Python hook did: sparse and non-contiguous gradients, the tensors a lossy
// compressor takes (`set_python_only`), a pass too many (Horovod's AssertionError) and a missing
// engine.
//
// Why not a C++ post hook on the gradient accumulator, as DDP's reducer has: while a node has
// post hooks, torch's autograd engine keeps a reference to the node's inputs for them, so the
// accumulator can no longer steal the incoming gradient and clones it instead: on the MLP that
// cost more (a copy of every gradient) than the Python call it saved.
//
// torch calls post-accumulate-grad hooks with the GIL held, and Python calls the rest of this
// class with it too: the GIL serialises every access, so the counts need no lock of their own.
// The engine's mark_ready is called with the GIL released (Note [No GIL under an engine lock]).
#pragma once

#include <torch/extension.h>

#include <memory>
#include <optional>
#include <vector>

#include "engine.h"

namespace commsched {

class GradientIntake {
 public:
  // Tensor ids 0..tensors-1. `first_gradient()` runs before the iteration's first gradient is
  // taken and sets `started`; `slow_path(tensor_id)` takes what the common case does not cover
  // (Note [Gradients handed over in C++]).
  GradientIntake(int64_t tensors, int64_t passes, pybind11::function first_gradient,
                 pybind11::function slow_path);

  void set_engine(std::shared_ptr<Engine> engine) { engine_ = std::move(engine); }
  void set_python_only(int64_t tensor_id, bool on);
  bool started() const { return started_; }
  void set_started(bool started) { started_ = started; }
  // While held, a gradient is left in ``p.grad`` to accumulate; nothing is counted, handed over
  // or run in Python (DDP's no_sync(); Note [Accumulating without sending] in gradient_intake.cpp).
  bool held() const { return held_; }
  void set_held(bool held) { held_ = held; }
  // Every tensor expects `passes` more gradients, none handed over yet (set_passes).
  void reset(int64_t passes);
  // reset(passes), and first_gradient runs again before the next gradient.
  void next_iteration(int64_t passes) {
    reset(passes);
    started_ = false;
  }
  // Passes still expected for `tensor_id` in this iteration.
  int64_t remaining(int64_t tensor_id) const;
  // Counts one pass of `tensor_id` (at least one must remain) and returns how many remained
  // before it: 1 means the gradient is final and goes to the engine.
  int64_t take_pass(int64_t tensor_id);
  int64_t handed() const { return handed_; }
  int64_t marked() const { return marked_; }
  // The hook of `param`, tensor `tensor_id`: called by torch after its gradient was accumulated.
  void on_gradient(int64_t tensor_id, const at::Tensor& param);

 private:
  void check_id(int64_t tensor_id) const;

  std::shared_ptr<Engine> engine_;
  std::vector<int64_t> delay_;     // per tensor id: passes still expected this iteration
  std::vector<char> python_only_;  // per tensor id
  int64_t handed_ = 0;             // gradients counted this iteration (any pass)
  int64_t marked_ = 0;             // of those, final ones (to the engine or the slow path)
  bool started_ = false;           // first_gradient ran in this iteration
  bool held_ = false;              // gradients stay in p.grad (no_sync())
  pybind11::function first_gradient_;
  pybind11::function slow_path_;
};

// Moves gradients in and out of ``p.grad`` for a list of parameters in one call: what Python does
// with ``p.grad = g`` per parameter, without a Python statement per parameter (an overlap plan
// takes every gradient out at step() and puts each back for its group's update).
std::vector<at::Tensor> take_grads(std::vector<at::Tensor> params);
void set_grads(std::vector<at::Tensor> params,
               const std::vector<std::optional<at::Tensor>>& grads);
void clear_grads(std::vector<at::Tensor> params);
// Removes torch's post-accumulate-grad hook object from each parameter (Note [An empty hook dict
// still costs a call]); the caller has emptied and unset the Python side.
void drop_post_accumulate_grad_hooks(const std::vector<at::Tensor>& params);

// One parameter's hook: what register_post_accumulate_grad_hook is given.
struct GradientHook {
  std::shared_ptr<GradientIntake> intake;
  int64_t tensor_id;
  void operator()(const at::Tensor& param) const { intake->on_gradient(tensor_id, param); }
};

}  // namespace commsched
