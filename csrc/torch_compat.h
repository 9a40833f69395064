// Every difference between the torch versions commsched supports (2.4 up to the newest tested,
// see commsched/torch_compat.py for the range) that the C++ side has to bridge, in one place.
// Nothing else in csrc/ tests TORCH_VERSION_*.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/version.h>

#define COMMSCHED_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace commsched::torch_compat {

// Flat (single-tensor) reduce-scatter and all-gather on a process group. torch 2.13 renamed
// ProcessGroup::_reduce_scatter_base / _allgather_base to reduce_scatter_single /
// all_gather_single and deprecated the old names (2.15 still has them, as deprecated aliases);
// before 2.13 only the old names exist. Arguments and results are the same in every version:
// (output, input, options) -> Work.
inline c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
    c10d::ProcessGroup& group, at::Tensor& output, at::Tensor& input,
    const c10d::ReduceScatterOptions& options) {
#if COMMSCHED_TORCH_AT_LEAST(2, 13)
  return group.reduce_scatter_single(output, input, options);
#else
  return group._reduce_scatter_base(output, input, options);
#endif
}

inline c10::intrusive_ptr<c10d::Work> all_gather_single(c10d::ProcessGroup& group,
                                                        at::Tensor& output, at::Tensor& input) {
#if COMMSCHED_TORCH_AT_LEAST(2, 13)
  return group.all_gather_single(output, input);
#else
  return group._allgather_base(output, input);
#endif
}

}  // namespace commsched::torch_compat
