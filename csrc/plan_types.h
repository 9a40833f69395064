// Plan data as the engine sees it: the Python planner decides, the engine executes.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace commsched {

enum class Collective : int64_t { kAllreduce = 0 };

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
};

c10::ScalarType scalar_type_from_name(const std::string& name);
const char* collective_name(Collective op);

}  // namespace commsched
