#include "plan_types.h"

#include <c10/util/Exception.h>

#include <unordered_map>

namespace commsched {

c10::ScalarType scalar_type_from_name(const std::string& name) {
  static const std::unordered_map<std::string, c10::ScalarType> kTypes = {
      {"float32", c10::kFloat},  {"float64", c10::kDouble}, {"float16", c10::kHalf},
      {"bfloat16", c10::kBFloat16}, {"int32", c10::kInt},   {"int64", c10::kLong},
      {"int16", c10::kShort},    {"int8", c10::kChar},      {"uint8", c10::kByte},
  };
  auto it = kTypes.find(name);
  TORCH_CHECK(it != kTypes.end(), "commsched: unsupported wire dtype '", name, "'");
  return it->second;
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
