#include "plan_types.h"

#include <c10/util/Exception.h>

#include <utility>
#include <vector>

namespace commsched {

namespace {

// The dtype names Python's plans are written in (commsched.plan.dtype_name).
const std::vector<std::pair<std::string, c10::ScalarType>>& wire_types() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> kTypes = {
      {"float32", c10::kFloat},  {"float64", c10::kDouble}, {"float16", c10::kHalf},
      {"bfloat16", c10::kBFloat16}, {"int32", c10::kInt},   {"int64", c10::kLong},
      {"int16", c10::kShort},    {"int8", c10::kChar},      {"uint8", c10::kByte},
  };
  return kTypes;
}

}  // namespace

c10::ScalarType scalar_type_from_name(const std::string& name) {
  for (const auto& [known, type] : wire_types())
    if (known == name) return type;
  TORCH_CHECK(false, "commsched: unsupported wire dtype '", name, "'");
}

std::string scalar_type_name(c10::ScalarType type) {
  for (const auto& [name, known] : wire_types())
    if (known == type) return name;
  TORCH_INTERNAL_ASSERT(false, "commsched: no wire name for dtype ", c10::toString(type));
}

const char* collective_name(Collective op) {
  switch (op) {
    case Collective::kAllreduce:
      return "allreduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "all_gather";
  }
  return "unknown";
}

}  // namespace commsched
