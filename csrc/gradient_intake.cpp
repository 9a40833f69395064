#include "gradient_intake.h"

namespace commsched {

GradientIntake::GradientIntake(int64_t tensors, int64_t passes, pybind11::function first_gradient,
                               pybind11::function slow_path)
    : delay_(tensors, passes),
      python_only_(tensors, 0),
      first_gradient_(std::move(first_gradient)),
      slow_path_(std::move(slow_path)) {
  TORCH_CHECK(tensors >= 0, "commsched: negative tensor count ", tensors);
  TORCH_CHECK(passes > 0, "commsched: backward_passes_per_step must be > 0, got ", passes);
}

void GradientIntake::check_id(int64_t tensor_id) const {
  TORCH_CHECK(tensor_id >= 0 && tensor_id < static_cast<int64_t>(delay_.size()),
              "commsched: unknown tensor id ", tensor_id);
}

void GradientIntake::set_python_only(int64_t tensor_id, bool on) {
  check_id(tensor_id);
  python_only_[tensor_id] = on ? 1 : 0;
}

void GradientIntake::reset(int64_t passes) {
  TORCH_CHECK(passes > 0, "commsched: backward_passes_per_step must be > 0, got ", passes);
  std::fill(delay_.begin(), delay_.end(), passes);
  handed_ = 0;
  marked_ = 0;
}

int64_t GradientIntake::remaining(int64_t tensor_id) const {
  check_id(tensor_id);
  return delay_[tensor_id];
}

int64_t GradientIntake::take_pass(int64_t tensor_id) {
  check_id(tensor_id);
  const int64_t before = delay_[tensor_id];
  TORCH_CHECK(before > 0, "commsched: no pass of tensor id ", tensor_id, " remains");
  delay_[tensor_id] = before - 1;
  handed_ += 1;
  if (before == 1) marked_ += 1;
  return before;
}

void GradientIntake::on_gradient(int64_t tensor_id, const at::Tensor& param) {
  TORCH_INTERNAL_ASSERT(tensor_id >= 0 && tensor_id < static_cast<int64_t>(delay_.size()));
  // Note [Accumulating without sending]
  // Under no_sync() autograd has already summed this gradient into p.grad, where it stays: the
  // first backward outside the block hands over the sum of every pass, so the iteration (its
  // first_gradient, its profile) starts there, as DDP's reducer does.
  if (held_) return;
  if (!started_) first_gradient_();  // a Python exception propagates as itself
  const at::Tensor& grad = param.grad();
  const bool common = started_ && !python_only_[tensor_id] && engine_ && delay_[tensor_id] > 0 &&
                      (!grad.defined() || (grad.layout() == at::kStrided && grad.is_contiguous()));
  if (!common) {
    slow_path_(tensor_id);
    return;
  }
  if (!grad.defined()) return;  // nothing to hand over, nothing counted (as in the slow path)
  if (take_pass(tensor_id) != 1) return;  // more passes of this tensor to come
  std::shared_ptr<Engine> engine = engine_;
  pybind11::gil_scoped_release no_gil;
  engine->mark_ready(tensor_id, grad);
}

std::vector<at::Tensor> take_grads(std::vector<at::Tensor> params) {
  std::vector<at::Tensor> out;
  out.reserve(params.size());
  for (auto& param : params) {
    out.push_back(param.grad());
    param.mutable_grad().reset();
  }
  return out;
}

void set_grads(std::vector<at::Tensor> params,
               const std::vector<std::optional<at::Tensor>>& grads) {
  TORCH_CHECK(params.size() == grads.size(), "commsched: ", grads.size(), " gradients for ",
              params.size(), " parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor grad = grads[i].value_or(at::Tensor());
    TORCH_CHECK(!grad.defined() || grad.sizes() == params[i].sizes(),
                "commsched: a gradient of shape ", grad.sizes(), " for a parameter of shape ",
                params[i].sizes());
    params[i].mutable_grad() = grad;
  }
}

void clear_grads(std::vector<at::Tensor> params) {
  for (auto& param : params) param.mutable_grad().reset();
}

// Note [An empty hook dict still costs a call]
// Removing a tensor's last post-accumulate-grad hook leaves torch's C++ hook object on it, which
// still takes the GIL and walks the now empty dict after every accumulation (about 1 us a
// parameter here); setting the Python attribute to None does not remove it either. A world of
// one stepping as the plain optimizer (Note [A world of one steps as the plain optimizer] in
// commsched/runtime/modes/plain.py) removes it here, after Python set the attribute to None so
// that a later registration installs a fresh one.
void drop_post_accumulate_grad_hooks(const std::vector<at::Tensor>& params) {
  for (const auto& param : params) torch::autograd::impl::post_acc_grad_hooks(param).reset();
}

}  // namespace commsched
