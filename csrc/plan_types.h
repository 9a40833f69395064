// Plan data as the engine sees it: the Python planner decides, the engine executes.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace commsched {

enum class Collective : int64_t { kAllreduce = 0, kReduceScatter = 1, kAllGather = 2 };

// A contiguous slice [offset, offset + numel) of one gradient (flattened view).
struct PieceSpec {
  int64_t tensor_id;
  int64_t offset;
  int64_t numel;
};

struct BlockSpec {
  int64_t block_id;
  Collective op;
  std::vector<PieceSpec> pieces;
  c10::ScalarType wire_dtype;  // dtype of the fusion buffer on the wire
  double prescale;             // applied to the packed buffer before the collective
  double postscale;            // applied after it (e.g. 1/world for Average)
  // Forward-stage blocks are not launched by gradient readiness but when the caller releases
  // them (DeAR's all-gather, just ahead of the layer that needs it).
  bool released_by_caller = false;
  // For an all-gather: plan position of the reduce-scatter whose shard it gathers. -1 on an
  // all-gather means standalone: rank r contributes the r-th of world equal slices of the block.
  int64_t source = -1;
};

c10::ScalarType scalar_type_from_name(const std::string& name);
std::string scalar_type_name(c10::ScalarType type);
const char* collective_name(Collective op);

}  // namespace commsched
