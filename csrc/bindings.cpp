// Python bindings of commsched._C. Every call that may block releases the GIL.
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "engine.h"
#include "transport.h"

namespace py = pybind11;
using commsched::BlockSpec;
using commsched::Engine;

namespace {

// A block arrives from Python as (block_id, op, wire_dtype_name, prescale, postscale,
// [(tensor_id, offset, numel), ...], released_by_caller, source_position).
using BlockTuple = std::tuple<int64_t, int64_t, std::string, double, double,
                              std::vector<std::tuple<int64_t, int64_t, int64_t>>, bool, int64_t>;

std::vector<BlockSpec> to_blocks(const std::vector<BlockTuple>& tuples) {
  std::vector<BlockSpec> blocks;
  blocks.reserve(tuples.size());
  for (const auto& [id, op, dtype, prescale, postscale, pieces, released, source] : tuples) {
    TORCH_CHECK(op >= 0 && op <= static_cast<int64_t>(commsched::Collective::kAllGather),
                "commsched: block ", id, " has unknown collective ", op);
    BlockSpec block{id,        static_cast<commsched::Collective>(op), {},
                    commsched::scalar_type_from_name(dtype), prescale, postscale, released, source};
    for (const auto& [tensor, offset, numel] : pieces) block.pieces.push_back({tensor, offset, numel});
    blocks.push_back(std::move(block));
  }
  return blocks;
}

std::shared_ptr<Engine> make_engine(const py::object& group, std::vector<std::string> names,
                                    int64_t timeout_ms) {
  std::shared_ptr<commsched::Transport> transport;
  if (group.is_none()) {
    transport = std::make_shared<commsched::LocalTransport>();
  } else {
    auto pg = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
    transport = std::make_shared<commsched::ProcessGroupTransport>(pg);
  }
  return std::make_shared<Engine>(transport, std::move(names), timeout_ms);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "commsched engine: executes communication plans on background threads";
  m.def("now_us", &commsched::now_us, "Engine clock (steady, microseconds)");
  m.attr("ALLREDUCE") = static_cast<int64_t>(commsched::Collective::kAllreduce);
  m.attr("REDUCE_SCATTER") = static_cast<int64_t>(commsched::Collective::kReduceScatter);
  m.attr("ALL_GATHER") = static_cast<int64_t>(commsched::Collective::kAllGather);

  py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine")
      .def(py::init(&make_engine), py::arg("process_group"), py::arg("tensor_names"),
           py::arg("timeout_ms"))
      .def("install_plan",
           [](Engine& self, const std::vector<BlockTuple>& blocks) {
             auto specs = to_blocks(blocks);
             py::gil_scoped_release release;
             self.install_plan(std::move(specs));
           })
      .def("mark_ready", &Engine::mark_ready, py::call_guard<py::gil_scoped_release>())
      .def("is_ready", &Engine::is_ready)
      .def("not_ready_tensors", &Engine::not_ready_tensors)
      .def("wait_all", &Engine::wait_all, py::call_guard<py::gil_scoped_release>())
      .def("wait_block", &Engine::wait_block, py::call_guard<py::gil_scoped_release>())
      .def("release", &Engine::release)
      .def("set_credit", &Engine::set_credit)
      .def("last_ready_us", &Engine::last_ready_us)
      .def("last_block_timings",
           [](Engine& self) {
             py::list out;
             for (const auto& t : self.last_block_timings())
               out.append(py::make_tuple(t.block_id, t.bytes, t.ready_us, t.launch_us, t.done_us,
                                         t.service_us));
             return out;
           })
      .def("set_timeline", [](Engine& self, bool on) { self.timeline().set_enabled(on); })
      .def("drain_events",
           [](Engine& self) {
             py::list out;
             for (const auto& e : self.timeline().drain())
               out.append(py::make_tuple(e.name, std::string(1, e.phase), e.ts_us, e.dur_us,
                                         e.lane, e.block_id, e.bytes, e.op));
             return out;
           })
      .def_property_readonly("world_size", &Engine::world_size)
      .def("shutdown", &Engine::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("release_transport", &Engine::release_transport,
           py::call_guard<py::gil_scoped_release>());
}
