// adaps._core: Python bindings of adaps::Worker (pybind11).
//
// Buffers: anything with the buffer protocol (NumPy arrays) and PyTorch CPU tensors (through
// a `.detach().numpy()` view, which shares the tensor's memory). Outputs and declared values
// must be C-contiguous float32 and writable, and are written in place; gradients are read
// in place when they are C-contiguous float32 and converted (one copy) otherwise.
// Asynchronous calls return a Handle that keeps the buffers alive until the operation ends;
// a Handle dropped unfinished waits for it, so the library never writes freed memory.
// The GIL is released whenever the library works or waits. A non-OK status raises
// adaps.Error(message) with `.code` (absl::StatusCode value) and `.code_name`.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "adaps/worker.h"

namespace py = pybind11;

namespace adaps {
namespace {

// adaps._core.Error, created at module init.
PyObject* g_error_type = nullptr;

[[noreturn]] void RaiseStatus(const absl::Status& status) {
  py::object type = py::reinterpret_borrow<py::object>(g_error_type);
  py::object error = type(std::string(status.message()));
  error.attr("code") = static_cast<int>(status.code());
  error.attr("code_name") = absl::StatusCodeToString(status.code());
  PyErr_SetObject(g_error_type, error.ptr());
  throw py::error_already_set();
}

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) RaiseStatus(status);
}

[[noreturn]] void RaiseInvalid(const std::string& message) {
  RaiseStatus(absl::InvalidArgumentError(message));
}

// A float32 buffer borrowed from a Python object (kept alive by `owner`).
struct Borrowed {
  py::object owner;  // the object whose memory `data` points into
  float* data = nullptr;
  size_t size = 0;
  std::vector<int64_t> shape;
};

bool IsTorchTensor(const py::handle& obj) {
  py::object type = py::type::of(obj);
  const std::string module = py::str(type.attr("__module__"));
  return module.rfind("torch", 0) == 0 && py::hasattr(obj, "numpy");
}

// For outputs (`writable`) the memory must be usable as is; for inputs a copy is allowed.
Borrowed Borrow(py::object obj, bool writable, const char* what) {
  if (IsTorchTensor(obj)) {
    const std::string device = py::str(obj.attr("device").attr("type"));
    if (device != "cpu") {
      RaiseInvalid(absl::StrCat(what, ": only CPU tensors are supported (got a ", device,
                                " tensor); copy it with .cpu() first"));
    }
    obj = obj.attr("detach")().attr("numpy")();
  }
  if (!PyObject_CheckBuffer(obj.ptr())) {
    if (writable) {
      RaiseInvalid(absl::StrCat(what, ": expected a float32 NumPy array or CPU tensor, got ",
                                std::string(py::str(py::type::of(obj).attr("__name__")))));
    }
    obj = py::module_::import("numpy").attr("ascontiguousarray")(obj, "float32");
  }
  py::buffer buffer = py::reinterpret_borrow<py::buffer>(obj);
  py::buffer_info info = buffer.request(writable);
  const bool is_float32 =
      info.itemsize == 4 && info.format == py::format_descriptor<float>::format();
  bool contiguous = true;
  py::ssize_t expect = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] != 1 && info.strides[d] != expect) contiguous = false;
    expect *= info.shape[d];
  }
  if (!is_float32 || !contiguous) {
    if (writable) {
      RaiseInvalid(absl::StrCat(what, ": must be C-contiguous float32 (format '", info.format,
                                "', ", contiguous ? "contiguous" : "strided", ")"));
    }
    py::object copy = py::module_::import("numpy").attr("ascontiguousarray")(obj, "float32");
    return Borrow(copy, false, what);
  }
  Borrowed b;
  b.owner = obj;
  b.data = static_cast<float*>(info.ptr);
  b.size = static_cast<size_t>(info.size);
  b.shape.assign(info.shape.begin(), info.shape.end());
  return b;
}

// The pending result of an asynchronous call.
class Handle {
 public:
  Handle(std::future<absl::Status> future, std::vector<py::object> keep)
      : future_(std::move(future)), keep_(std::move(keep)) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (!status_.has_value() && future_.valid()) {
      py::gil_scoped_release release;
      future_.wait();
    }
  }

  bool done() {
    if (status_.has_value()) return true;
    return future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

  // Waits (GIL released; Ctrl-C is honoured between 50 ms slices) and raises on failure.
  // `timeout` in seconds, None = until the library answers (it has its own deadlines).
  void Wait(std::optional<double> timeout) {
    if (!status_.has_value()) {
      const auto start = std::chrono::steady_clock::now();
      while (true) {
        std::future_status ready;
        {
          py::gil_scoped_release release;
          ready = future_.wait_for(std::chrono::milliseconds(50));
        }
        if (ready == std::future_status::ready) break;
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
        if (timeout.has_value() &&
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
                *timeout) {
          RaiseStatus(absl::DeadlineExceededError(
              absl::StrCat("Handle.wait: no answer within ", *timeout, " s")));
        }
      }
      status_ = future_.get();
      keep_.clear();
    }
    ThrowIfError(*status_);
  }

 private:
  std::future<absl::Status> future_;
  std::vector<py::object> keep_;
  std::optional<absl::Status> status_;
};

Compression ParseCompression(const std::string& name) {
  if (name == "dense") return Compression::kDense;
  if (name == "adacomp") return Compression::kAdaComp;
  if (name == "topk") return Compression::kTopK;
  if (name == "sign") return Compression::kSign;
  RaiseInvalid(absl::StrCat("unknown compression '", name, "' (dense, adacomp, topk or sign)"));
}

PullFormat ParsePull(const std::string& name) {
  if (name == "dense") return PullFormat::kDense;
  if (name == "recompressed") return PullFormat::kRecompressed;
  if (name == "sparse") return PullFormat::kSparse;
  RaiseInvalid(
      absl::StrCat("unknown pull format '", name, "' (dense, recompressed or sparse)"));
}

absl::Duration Seconds(double s) { return absl::Milliseconds(static_cast<int64_t>(s * 1000)); }

// Worker plus the Python-side conveniences.
class PyWorker {
 public:
  PyWorker(std::unique_ptr<Worker> worker, bool emulates_devices)
      : worker_(std::move(worker)), emulates_devices_(emulates_devices) {}
  bool emulates_devices() const { return emulates_devices_; }

  Worker& get() {
    if (!worker_) RaiseStatus(absl::FailedPreconditionError("worker was stopped"));
    return *worker_;
  }

  // Stop, or Leave (`flush`: the residues are pushed first).
  void Stop(bool flush = false) {
    if (!worker_) return;
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = flush ? worker_->Leave() : worker_->Stop();
      worker_.reset();
    }
    if (status.ok()) return;
    if (flush) ThrowIfError(status);  // leave(): what the residues held may not have arrived
    // stop(): the worker is stopped either way, and a scheduler that exited first (the end of
    // a job) cannot acknowledge a goodbye; a finished run does not fail on it (Horovod's
    // shutdown() and torch's destroy_process_group() do not either). Said, not raised.
    const std::string message = absl::StrCat(
        "adaps: this worker is stopped, but the scheduler did not acknowledge its goodbye (",
        status.ToString(), "); a running scheduler finds it gone by its silence");
    if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) < 0) {
      throw py::error_already_set();  // (warnings turned into errors)
    }
  }

 private:
  std::unique_ptr<Worker> worker_;
  const bool emulates_devices_;
};

std::unique_ptr<PyWorker> CreateWorker(const std::string& scheduler, const std::string& identity,
                                       double register_timeout, double request_timeout,
                                       bool compact_indices, const std::string& log_level,
                                       int compression_threads,
                                       const std::string& curve_server_key,
                                       const std::string& curve_client_key,
                                       bool emulate_devices) {
  WorkerOptions options;
  options.emulate_devices = emulate_devices;
  ThrowIfError(options.LoadCurveKeys(curve_server_key, curve_client_key));
  options.compression_threads = compression_threads;
  options.scheduler = scheduler;
  options.identity = identity;
  options.register_timeout = Seconds(register_timeout);
  options.request_timeout = Seconds(request_timeout);
  options.compact_indices = compact_indices;
  options.log_level = log_level;
  absl::StatusOr<std::unique_ptr<Worker>> worker;
  {
    py::gil_scoped_release release;
    worker = Worker::Create(options);
  }
  if (!worker.ok()) RaiseStatus(worker.status());
  return std::make_unique<PyWorker>(*std::move(worker), emulate_devices);
}

void Declare(PyWorker& self, const std::string& name, py::object values,
             std::optional<std::vector<int64_t>> shape, uint32_t bin_size,
             const std::string& compression, double topk_fraction, const std::string& pull,
             bool fuse, uint32_t pull_bin_divisor, int device, bool keep_sum) {
  Borrowed v = Borrow(values, /*writable=*/true, "declare: values");
  TensorSpec spec;
  spec.name = name;
  spec.shape = shape.has_value() ? *shape : v.shape;
  if (spec.shape.empty()) spec.shape = {1};  // a 0-d tensor is one element
  spec.bin_size = bin_size;
  spec.compression = ParseCompression(compression);
  spec.topk_fraction = topk_fraction;
  spec.pull = ParsePull(pull);
  spec.fuse = fuse;
  spec.pull_bin_divisor = pull_bin_divisor;
  spec.device = device;
  spec.keep_sum = keep_sum;
  Worker& worker = self.get();
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = worker.Declare(spec, absl::MakeSpan(v.data, v.size));
  }
  ThrowIfError(status);
}

std::unique_ptr<Handle> PushPull(PyWorker& self, const std::string& name, py::object grad,
                                 py::object out) {
  Borrowed g = Borrow(grad, /*writable=*/false, "push_pull: grad");
  Borrowed o = Borrow(out, /*writable=*/true, "push_pull: out");
  Worker& worker = self.get();
  std::future<absl::Status> future;
  {
    py::gil_scoped_release release;
    future =
        worker.PushPull(name, absl::MakeConstSpan(g.data, g.size), absl::MakeSpan(o.data, o.size));
  }
  return std::make_unique<Handle>(std::move(future), std::vector<py::object>{g.owner, o.owner});
}

std::unique_ptr<Handle> Push(PyWorker& self, const std::string& name, py::object grad) {
  Borrowed g = Borrow(grad, /*writable=*/false, "push: grad");
  Worker& worker = self.get();
  std::future<absl::Status> future;
  {
    py::gil_scoped_release release;
    future = worker.Push(name, absl::MakeConstSpan(g.data, g.size));
  }
  return std::make_unique<Handle>(std::move(future), std::vector<py::object>{g.owner});
}

std::unique_ptr<Handle> Pull(PyWorker& self, const std::string& name, py::object out) {
  Borrowed o = Borrow(out, /*writable=*/true, "pull: out");
  Worker& worker = self.get();
  std::future<absl::Status> future;
  {
    py::gil_scoped_release release;
    future = worker.Pull(name, absl::MakeSpan(o.data, o.size));
  }
  return std::make_unique<Handle>(std::move(future), std::vector<py::object>{o.owner});
}

// A tensor on a device: its gradient and parameters as device addresses (a torch CUDA
// tensor's data_ptr()) and the trainer's stream (cuda_stream; 0: the default stream); `keep`
// is held until the operation ended (the tensors the addresses belong to).
std::unique_ptr<Handle> PushPullDevice(PyWorker& self, const std::string& name, uintptr_t grad,
                                       uintptr_t out, uintptr_t stream, py::list keep) {
  Worker& worker = self.get();
  std::future<absl::Status> future;
  {
    py::gil_scoped_release release;
    future = worker.PushPullOnDevice(name, reinterpret_cast<const float*>(grad),
                                     reinterpret_cast<float*>(out),
                                     reinterpret_cast<void*>(stream));
  }
  std::vector<py::object> owners;
  for (py::handle h : keep) owners.push_back(py::reinterpret_borrow<py::object>(h));
  return std::make_unique<Handle>(std::move(future), std::move(owners));
}

template <typename F>
void Blocking(F&& f) {
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = f();
  }
  ThrowIfError(status);
}

py::dict Traffic(PyWorker& self, const std::string& name) {
  absl::StatusOr<TrafficCounters> t = self.get().Traffic(name);
  if (!t.ok()) RaiseStatus(t.status());
  py::dict d;
  d["pushes"] = t->pushes;
  d["pulls"] = t->pulls;
  d["push_wire_bytes"] = t->push_wire_bytes;
  d["pull_wire_bytes"] = t->pull_wire_bytes;
  d["push_dense_bytes"] = t->push_dense_bytes;
  d["pull_dense_bytes"] = t->pull_dense_bytes;
  d["compress_seconds"] = t->compress_seconds;
  d["decode_seconds"] = t->decode_seconds;
  d["server_seconds"] = t->server_seconds;
  d["pulls_answered_sparse"] = t->pulls_answered_sparse;
  d["pulls_answered_forwarded"] = t->pulls_answered_forwarded;
  d["pulls_answered_dense"] = t->pulls_answered_dense;
  return d;
}

py::list Slices(PyWorker& self, const std::string& name) {
  absl::StatusOr<std::vector<SliceInfo>> slices = self.get().Slices(name);
  if (!slices.ok()) RaiseStatus(slices.status());
  py::list out;
  for (const SliceInfo& s : *slices) {
    py::dict d;
    d["offset"] = s.offset;
    d["length"] = s.length;
    d["server"] = s.server;
    out.append(d);
  }
  return out;
}

void DefineModule(py::module_& m) {
  m.doc() = "adaps worker library bindings (see the adaps package for the documented API)";
#ifdef ADAPS_WORKER_WITH_CUDA
  m.attr("CUDA_BUILT") = true;
#else
  m.attr("CUDA_BUILT") = false;
#endif

  g_error_type = PyErr_NewExceptionWithDoc(
      "adaps._core.Error",
      "A non-OK status from the adaps worker library. `code` is the absl::StatusCode value "
      "(3 invalid argument, 4 deadline exceeded, 9 failed precondition, 14 unavailable, 15 "
      "data loss), `code_name` its name; str(error) is the status message.",
      PyExc_RuntimeError, nullptr);
  m.add_object("Error", py::handle(g_error_type));

  py::class_<Handle>(m, "Handle", "The pending result of push, pull or push_pull.")
      .def("wait", &Handle::Wait, py::arg("timeout") = py::none(),
           "Waits until the operation ended; raises adaps.Error on failure.")
      .def("done", &Handle::done, "True when wait() would not block.");

  py::class_<PyWorker>(m, "Worker")
      .def(py::init(&CreateWorker), py::arg("scheduler"), py::arg("identity") = "",
           py::arg("register_timeout") = 60.0, py::arg("request_timeout") = 30.0,
           py::arg("compact_indices") = true, py::arg("log_level") = "warn",
           py::arg("compression_threads") = 1, py::arg("curve_server_key") = "",
           py::arg("curve_client_key") = "", py::arg("emulate_devices") = false)
      .def_property_readonly("rank", [](PyWorker& w) { return w.get().rank(); })
      .def_property_readonly("num_workers", [](PyWorker& w) { return w.get().num_workers(); },
                             "One past the highest worker rank (the starting count, more once "
                             "workers joined a running job)")
      .def_property_readonly("live_workers", [](PyWorker& w) { return w.get().live_workers(); },
                             "The workers live now (this one included): what the servers' "
                             "steps average over; changes as workers join, leave or die")
      .def_property_readonly("rejoined", [](PyWorker& w) { return w.get().rejoined(); },
                             "True when this worker joined a running job (or registered "
                             "again into it after a restart): its Declare pulls the servers' "
                             "current values instead of making rank 0's everyone's")
      .def_property_readonly("num_servers", [](PyWorker& w) { return w.get().num_servers(); })
      .def_property_readonly("emulates_devices", &PyWorker::emulates_devices,
                             "Tensors declared on a device live in host memory (tests)")
      .def_property_readonly("server_optimizer",
                             [](PyWorker& w) { return w.get().server_optimizer(); },
                             "The servers' --optimizer (mean: local mode; sgd, momentum, "
                             "nesterov, adam: server mode), from the cluster view; '' when "
                             "the servers did not say")
      .def("declare", &Declare, py::arg("name"), py::arg("values"), py::arg("shape") = py::none(),
           py::arg("bin_size") = 500, py::arg("compression") = "adacomp",
           py::arg("topk_fraction") = 0.001, py::arg("pull") = "dense", py::arg("fuse") = true,
           py::arg("pull_bin_divisor") = 1, py::arg("device") = -1, py::arg("keep_sum") = false)
      .def("push_pull", &PushPull, py::arg("name"), py::arg("grad"), py::arg("out"))
      .def("push_pull_device", &PushPullDevice, py::arg("name"), py::arg("grad"),
           py::arg("out"), py::arg("stream") = 0, py::arg("keep") = py::list(),
           "push_pull for a tensor declared with device=N: grad and out are device addresses "
           "(a CUDA tensor's data_ptr(), the tensor's length each), stream the trainer's "
           "(torch.cuda.current_stream().cuda_stream; 0: the default stream); keep: objects "
           "held until the operation ended")
      .def("push", &Push, py::arg("name"), py::arg("grad"))
      .def("pull", &Pull, py::arg("name"), py::arg("out"))
      .def("barrier",
           [](PyWorker& w) {
             Worker& x = w.get();
             Blocking([&] { return x.Barrier(); });
           })
      .def(
          "set_hyper",
          [](PyWorker& w, const std::vector<std::pair<std::string, double>>& params) {
            Worker& x = w.get();
            Blocking([&] { return x.SetHyper(params); });
          },
          py::arg("params"))
      .def(
          "pull_parameters",
          [](PyWorker& w, const std::string& name, py::object out) {
            Borrowed o = Borrow(out, /*writable=*/true, "pull_parameters: out");
            Worker& x = w.get();
            Blocking([&] { return x.PullParameters(name, absl::MakeSpan(o.data, o.size)); });
          },
          py::arg("name"), py::arg("out"),
          "Blocks until `out` holds the servers' parameters of `name` as of their last "
          "completed step, exactly (a dense pull; the tensor's replica and residues are left "
          "alone). With recompressed pulls the parameters push_pull writes trail the servers' "
          "by what the downlink has not sent yet; this gives the trained model itself.")
      .def(
          "residue",
          [](PyWorker& w, const std::string& name, py::object out) {
            Borrowed o = Borrow(out, /*writable=*/true, "residue: out");
            absl::Status st = w.get().Residue(name, absl::MakeSpan(o.data, o.size));
            if (!st.ok()) RaiseStatus(st);
          },
          py::arg("name"), py::arg("out"),
          "Copies into `out` (float32, the tensor's length) what this worker's pushes of "
          "`name` hold back: its error-feedback residue, zeros for a tensor pushed dense. "
          "Not while a push of the tensor is in flight.")
      .def(
          "set_residue",
          [](PyWorker& w, const std::string& name, py::object values) {
            Borrowed v = Borrow(values, /*writable=*/false, "set_residue: values");
            absl::Status st = w.get().SetResidue(name, absl::MakeConstSpan(v.data, v.size));
            if (!st.ok()) RaiseStatus(st);
          },
          py::arg("name"), py::arg("values"),
          "Sets what `name`'s error feedback holds back (float32, the tensor's length: what "
          "residue() gave), e.g. from a checkpoint, so that a restarted worker resumes "
          "exactly. Call it between steps. INVALID_ARGUMENT for a dense tensor, a wrong "
          "length or a value that is not finite (nothing changes).")
      .def(
          "save_residues",
          [](PyWorker& w, const std::string& path) {
            absl::Status st = w.get().SaveResidues(path);
            if (!st.ok()) RaiseStatus(st);
          },
          py::arg("path"),
          "Writes every declared tensor's residue to `path` on this host (atomically), for "
          "load_residues in a restarted worker. Between steps.")
      .def(
          "load_residues",
          [](PyWorker& w, const std::string& path) {
            absl::Status st = w.get().LoadResidues(path);
            if (!st.ok()) RaiseStatus(st);
          },
          py::arg("path"),
          "Sets the residues from a file save_residues wrote (every tensor in it declared "
          "here, same length, with error feedback); NOT_FOUND, DATA_LOSS or INVALID_ARGUMENT "
          "and nothing changed otherwise. Between steps, before the first push.")
      .def(
          "last_sent",
          [](PyWorker& w, const std::string& name) {
            absl::StatusOr<std::vector<uint32_t>> sent = w.get().LastSent(name);
            if (!sent.ok()) RaiseStatus(sent.status());
            // Made by NumPy and written through the buffer protocol: Debian's pybind11
            // (2.10) reads a dtype's item size at NumPy 1's offsets, so under NumPy 2 an
            // array_t it allocates itself gets strides of 0.
            py::object out = py::module_::import("numpy").attr("empty")(
                static_cast<py::ssize_t>(sent->size()), "int64");
            py::buffer_info info = py::reinterpret_borrow<py::buffer>(out).request(true);
            int64_t* p = static_cast<int64_t*>(info.ptr);
            for (size_t k = 0; k < sent->size(); ++k) p[k] = (*sent)[k];
            return out;
          },
          py::arg("name"),
          "The indices (int64, ascending) of the elements of `name` that its last successful "
          "push sent: AdaComp's or Top-k's selection, every element of a dense push; empty "
          "before the first push. For DGC's momentum factor masking.")
      .def(
          "close_fusion_buckets", [](PyWorker& w) { w.get().CloseFusionBuckets(); },
          "Tensors declared from now on are fused into new buckets, never with the ones "
          "declared before: a group given at its own time each step (one optimizer's, when "
          "two step separately) does not wait for another's. Collective, like declare.")
      .def(
          "set_bin_size",
          [](PyWorker& w, const std::string& name, int64_t bin_size) {
            if (bin_size <= 0 || bin_size > UINT32_MAX) {
              RaiseStatus(absl::InvalidArgumentError(
                  absl::StrCat("bin size ", bin_size, " is out of range (1 to 2^32-1)")));
            }
            absl::Status s = w.get().SetBinSize(name, static_cast<uint32_t>(bin_size));
            if (!s.ok()) RaiseStatus(s);
          },
          py::arg("name"), py::arg("bin_size"),
          "Sets the AdaComp bin size of this worker's pushes of `name` from the next push on "
          "(the residue is kept; the servers' recompressed pulls keep the declared one; a "
          "fused tensor's too). Call between steps. For a sparsity warm-up (small bins first).")
      .def(
          "checkpoint",
          [](PyWorker& w, const std::string& dir) {
            Worker& x = w.get();
            Blocking([&] { return x.Checkpoint(dir); });
          },
          py::arg("directory"),
          "Asks every server to write its shard under `directory` (server-side path; empty: "
          "each server's --checkpoint_dir); with a directory this worker also writes its "
          "residues there (residue_checkpoint_path), for load_residues after a restart.")
      .def("residue_checkpoint_path",
           [](PyWorker& w, const std::string& dir) { return w.get().ResidueCheckpointPath(dir); },
           py::arg("directory"))
      .def("traffic", &Traffic, py::arg("name"))
      .def("slices", &Slices, py::arg("name"))
      .def("tensor_names", [](PyWorker& w) { return w.get().TensorNames(); })
      .def("stop", [](PyWorker& w) { w.Stop(false); },
           "Leaves the job and closes the connections (what the residues hold is not sent). "
           "A goodbye the scheduler does not acknowledge (it has exited) is a RuntimeWarning, "
           "not an error: the worker is stopped either way")
      .def("leave", [](PyWorker& w) { w.Stop(true); },
           "Leaves the job with nothing lost: pushes every compressed tensor's residue (dense, "
           "as its next step), then stops. Call it between steps.");
}

}  // namespace
}  // namespace adaps

PYBIND11_MODULE(_core, m) { adaps::DefineModule(m); }
