// Python bindings of commsched._C.
//
// Note [No GIL under an engine lock]
// Every call that takes one of the engine's locks (or may block) releases the GIL first. A
// thread holding such a lock may itself need the GIL: freeing the last reference to a tensor
// whose Python object C++ keeps alive takes the GIL (torch's PyObject preservation), and the
// caller's thread resets the iteration's gradients under the engine's mutex. A thread that
// held the GIL while waiting for that mutex (the liveness thread asks every second which
// tensors are not ready) would then freeze the whole process, heartbeats included.
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <map>

#include "engine.h"
#include "gradient_intake.h"
#include "transport.h"

namespace py = pybind11;
using commsched::BlockSpec;
using commsched::Engine;
using commsched::GradientIntake;

namespace {

// Blocks cross from Python as bound BlockSpec / PieceSpec structs built with keyword arguments,
// so a field can be neither forgotten nor swapped; the collective code is checked here, and
// Python checks at import that its Collective enum has these codes (collective_codes()).
BlockSpec make_block(int64_t block_id, int64_t op, const std::string& wire_dtype, double prescale,
                     double postscale, std::vector<commsched::PieceSpec> pieces,
                     bool released_by_caller, int64_t source) {
  TORCH_CHECK(op >= 0 && op <= static_cast<int64_t>(commsched::Collective::kAllGather),
              "commsched: block ", block_id, " has unknown collective ", op);
  for (const auto& piece : pieces) {
    TORCH_CHECK(piece.offset >= 0 && piece.numel >= 0, "commsched: block ", block_id,
                " has a piece of tensor ", piece.tensor_id, " with offset ", piece.offset,
                " and numel ", piece.numel);
  }
  return BlockSpec{block_id,   static_cast<commsched::Collective>(op),
                   std::move(pieces), commsched::scalar_type_from_name(wire_dtype),
                   prescale,   postscale,
                   released_by_caller, source};
}

std::shared_ptr<Engine> make_engine(const py::object& group, std::vector<std::string> names,
                                    int64_t timeout_ms, bool ring_collectives) {
  std::shared_ptr<commsched::Transport> transport;
  if (group.is_none()) {
    transport = std::make_shared<commsched::LocalTransport>();
  } else {
    auto pg = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
    transport = std::make_shared<commsched::ProcessGroupTransport>(pg, ring_collectives);
  }
  return std::make_shared<Engine>(transport, std::move(names), timeout_ms);
}

// One collective on `group` outside any engine, native or as the engine's ring: for the
// collectives benchmark and the ring's tests against torch's own collectives.
void run_collective(const py::object& group, int64_t op, at::Tensor input, at::Tensor output,
                    bool ring, int64_t timeout_ms) {
  TORCH_CHECK(op >= 0 && op <= 2, "commsched: unknown collective code ", op);
  auto pg = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  py::gil_scoped_release release;
  auto collective = static_cast<commsched::Collective>(op);
  commsched::ProcessGroupTransport transport(pg, ring);
  if (collective == commsched::Collective::kAllreduce) output = input;
  transport.launch(collective, input, output)->wait(std::chrono::milliseconds(timeout_ms));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "commsched engine: executes communication plans on background threads";
  m.def("now_us", &commsched::now_us, "Engine clock (steady, microseconds)");
  m.def("collective_codes", [] {
    std::map<std::string, int64_t> codes;
    for (auto op : {commsched::Collective::kAllreduce, commsched::Collective::kReduceScatter,
                    commsched::Collective::kAllGather})
      codes[commsched::collective_name(op)] = static_cast<int64_t>(op);
    return codes;
  }, "Collective name -> code, as the engine reads BlockSpec.op");

  m.def("run_collective", &run_collective, py::arg("process_group"), py::arg("op"),
        py::arg("input"), py::arg("output"), py::arg("ring"), py::arg("timeout_ms"),
        "One collective on a process group, native or as the engine's ring (tests, benchmarks)");

  py::class_<commsched::PieceSpec>(m, "PieceSpec")
      .def(py::init([](int64_t tensor_id, int64_t offset, int64_t numel) {
             return commsched::PieceSpec{tensor_id, offset, numel};
           }),
           py::kw_only(), py::arg("tensor_id"), py::arg("offset"), py::arg("numel"))
      .def_readonly("tensor_id", &commsched::PieceSpec::tensor_id)
      .def_readonly("offset", &commsched::PieceSpec::offset)
      .def_readonly("numel", &commsched::PieceSpec::numel);

  py::class_<BlockSpec>(m, "BlockSpec")
      .def(py::init(&make_block), py::kw_only(), py::arg("block_id"), py::arg("op"),
           py::arg("wire_dtype"), py::arg("prescale"), py::arg("postscale"), py::arg("pieces"),
           py::arg("released_by_caller") = false, py::arg("source") = -1)
      .def_readonly("block_id", &BlockSpec::block_id)
      .def_property_readonly("op", [](const BlockSpec& b) { return static_cast<int64_t>(b.op); })
      .def_property_readonly("wire_dtype",
                             [](const BlockSpec& b) { return commsched::scalar_type_name(b.wire_dtype); })
      .def_readonly("prescale", &BlockSpec::prescale)
      .def_readonly("postscale", &BlockSpec::postscale)
      .def_readonly("pieces", &BlockSpec::pieces)
      .def_readonly("released_by_caller", &BlockSpec::released_by_caller)
      .def_readonly("source", &BlockSpec::source);

  py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine")
      .def(py::init(&make_engine), py::arg("process_group"), py::arg("tensor_names"),
           py::arg("timeout_ms"), py::arg("ring_collectives") = false)
      .def("install_plan",
           [](Engine& self, std::vector<BlockSpec> blocks) {
             py::gil_scoped_release release;
             self.install_plan(std::move(blocks));
           },
           py::arg("blocks"))
      .def("mark_ready", &Engine::mark_ready, py::call_guard<py::gil_scoped_release>())
      .def("is_ready", &Engine::is_ready, py::call_guard<py::gil_scoped_release>())
      .def("not_ready_tensors", &Engine::not_ready_tensors, py::call_guard<py::gil_scoped_release>())
      .def("wait_all", &Engine::wait_all, py::call_guard<py::gil_scoped_release>())
      .def("wait_block", &Engine::wait_block, py::call_guard<py::gil_scoped_release>())
      .def("release", &Engine::release, py::call_guard<py::gil_scoped_release>())
      .def("reduced_shard", &Engine::reduced_shard, py::call_guard<py::gil_scoped_release>())
      .def("set_credit", &Engine::set_credit, py::call_guard<py::gil_scoped_release>())
      .def("set_local_ready_events", &Engine::set_local_ready_events)
      .def("last_ready_us", &Engine::last_ready_us, py::call_guard<py::gil_scoped_release>())
      .def("last_block_timings",
           [](Engine& self) {
             std::vector<commsched::BlockTiming> timings;
             {
               py::gil_scoped_release release;  // may wait for device events
               timings = self.last_block_timings();
             }
             py::list out;
             for (const auto& t : timings)
               out.append(py::make_tuple(t.block_id, t.bytes, t.ready_us, t.launch_us, t.done_us,
                                         t.service_us));
             return out;
           })
      .def("last_clocks",
           [](Engine& self) {
             commsched::Clocks clocks;
             {
               py::gil_scoped_release release;
               clocks = self.last_clocks();
             }
             py::dict out;
             out["ready"] = commsched::clock_name(clocks.ready);
             out["collective"] = commsched::clock_name(clocks.collective);
             return out;
           },
           "Which clock the last iteration's figures came from: 'cpu' or 'device_event'")
      .def("set_timeline", [](Engine& self, bool on) { self.timeline().set_enabled(on); })
      .def("drain_events",
           [](Engine& self) {
             std::vector<commsched::TimelineEvent> events;
             {
               py::gil_scoped_release release;
               events = self.timeline().drain();
             }
             py::list out;
             for (const auto& e : events)
               out.append(py::make_tuple(e.name, std::string(1, e.phase), e.ts_us, e.dur_us,
                                         e.lane, e.block_id, e.bytes, e.op, e.clock));
             return out;
           })
      .def_property_readonly("world_size", &Engine::world_size)
      .def_property_readonly("packed_bytes", &Engine::packed_bytes)
      .def_property_readonly("kept_buffer_bytes",
                             [](Engine& self) { return self.buffer_pool().kept_bytes(); })
      .def_property_readonly("kept_buffer_allocations",
                             [](Engine& self) { return self.buffer_pool().allocations(); })
      .def_property_readonly("waiting_since_us", &Engine::waiting_since_us)
      .def_property_readonly("waited_us", &Engine::waited_us)
      .def("shutdown", &Engine::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("release_transport", &Engine::release_transport,
           py::call_guard<py::gil_scoped_release>());

  // Note [Gradients handed over in C++] (gradient_intake.h).
  py::class_<GradientIntake, std::shared_ptr<GradientIntake>>(m, "GradientIntake")
      .def(py::init<int64_t, int64_t, py::function, py::function>(), py::arg("tensors"),
           py::arg("passes"), py::arg("first_gradient"), py::arg("slow_path"))
      .def("set_engine", &GradientIntake::set_engine, py::arg("engine"))
      .def("set_python_only", &GradientIntake::set_python_only, py::arg("tensor_id"),
           py::arg("on"))
      .def_property("started", &GradientIntake::started, &GradientIntake::set_started)
      .def_property("held", &GradientIntake::held, &GradientIntake::set_held)
      .def("reset", &GradientIntake::reset, py::arg("passes"))
      .def("next_iteration", &GradientIntake::next_iteration, py::arg("passes"))
      .def("remaining", &GradientIntake::remaining, py::arg("tensor_id"))
      .def("take_pass", &GradientIntake::take_pass, py::arg("tensor_id"))
      .def_property_readonly("handed", &GradientIntake::handed)
      .def_property_readonly("marked", &GradientIntake::marked)
      .def("hook",
           [](const std::shared_ptr<GradientIntake>& self, int64_t tensor_id) {
             return commsched::GradientHook{self, tensor_id};
           },
           py::arg("tensor_id"), "The post-accumulate-grad hook of tensor `tensor_id`");

  m.def("take_grads", &commsched::take_grads, py::arg("params"),
        "Each parameter's grad (None where it has none), left None on the parameter");
  m.def("set_grads", &commsched::set_grads, py::arg("params"), py::arg("grads"),
        "p.grad = g for each pair");
  m.def("clear_grads", &commsched::clear_grads, py::arg("params"), "p.grad = None for each");
  m.def("drop_post_accumulate_grad_hooks", &commsched::drop_post_accumulate_grad_hooks,
        py::arg("params"), "Removes torch's emptied post-accumulate-grad hook from each");
  m.def("no_grads",
        [](const py::iterable& param_groups) {
          for (py::handle group : param_groups)
            for (py::handle param : group["params"])
              if (py::cast<at::Tensor>(param).grad().defined()) return false;
          return true;
        },
        py::arg("param_groups"),
        "Whether no parameter of an optimizer's param_groups has a gradient");

  py::class_<commsched::GradientHook>(m, "GradientHook")
      .def("__call__", &commsched::GradientHook::operator(), py::arg("param"));
}
