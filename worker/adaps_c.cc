#include "adaps/adaps_c.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "adaps/local_steps.h"
#include "adaps/worker.h"

struct adaps_worker {
  std::unique_ptr<adaps::Worker> worker;
  std::string server_optimizer;  // from the registration's view, fixed afterwards
  std::unique_ptr<adaps::LocalSteps> local_steps;  // adaps_worker_local_steps
  bool declared = false;
  mutable absl::Mutex mu;
  std::string last_error ABSL_GUARDED_BY(mu);

  int Record(const absl::Status& status) {
    if (!status.ok()) {
      absl::MutexLock lock(&mu);
      last_error = status.ToString();
    }
    return static_cast<int>(status.code());
  }
};

extern "C" {

adaps_worker* adaps_worker_create(const char* scheduler, int request_timeout_ms, char* error,
                                  size_t error_size) {
  adaps::WorkerOptions options;
  options.scheduler = scheduler ? scheduler : "";
  if (request_timeout_ms > 0) {
    options.request_timeout = absl::Milliseconds(request_timeout_ms);
    options.register_timeout = options.request_timeout;
  }
  auto worker = adaps::Worker::Create(options);
  if (!worker.ok()) {
    if (error != nullptr && error_size > 0) {
      std::strncpy(error, worker.status().ToString().c_str(), error_size - 1);
      error[error_size - 1] = '\0';
    }
    return nullptr;
  }
  auto* handle = new adaps_worker;
  handle->worker = *std::move(worker);
  handle->server_optimizer = handle->worker->server_optimizer();
  return handle;
}

void adaps_worker_destroy(adaps_worker* worker) {
  if (worker == nullptr) return;
  worker->worker->Stop().IgnoreError();
  delete worker;
}

int adaps_worker_rank(const adaps_worker* worker) { return worker->worker->rank(); }
int adaps_worker_num_workers(const adaps_worker* worker) { return worker->worker->num_workers(); }
const char* adaps_worker_server_optimizer(const adaps_worker* worker) {
  return worker->server_optimizer.c_str();
}

const char* adaps_worker_last_error(const adaps_worker* worker) {
  // A copy per calling thread: another thread's error cannot change or free it.
  thread_local std::string copy;
  absl::MutexLock lock(&worker->mu);
  copy = worker->last_error;
  return copy.c_str();
}

namespace {

int Declare(adaps_worker* worker, const adaps_tensor_spec* spec, int device, float* values,
            size_t count) {
  if (spec == nullptr || spec->name == nullptr || (spec->ndim > 0 && spec->shape == nullptr)) {
    return worker->Record(absl::InvalidArgumentError("null tensor spec"));
  }
  if (spec->compression < 0 || spec->compression > 3 || spec->pull_format < 0 ||
      spec->pull_format > 2) {
    return worker->Record(absl::InvalidArgumentError("bad compression or pull format"));
  }
  adaps::TensorSpec s;
  s.name = spec->name;
  s.shape.assign(spec->shape, spec->shape + spec->ndim);
  s.bin_size = spec->bin_size;
  s.compression = static_cast<adaps::Compression>(spec->compression);
  s.topk_fraction = spec->topk_fraction;
  s.pull = static_cast<adaps::PullFormat>(spec->pull_format);
  s.device = device;
  worker->declared = true;
  if (worker->local_steps) {
    return worker->Record(worker->local_steps->Declare(s, absl::MakeSpan(values, count)));
  }
  return worker->Record(worker->worker->Declare(s, absl::MakeSpan(values, count)));
}

}  // namespace

int adaps_worker_declare(adaps_worker* worker, const adaps_tensor_spec* spec, float* values,
                         size_t count) {
  return Declare(worker, spec, -1, values, count);
}

int adaps_worker_declare_on_device(adaps_worker* worker, const adaps_tensor_spec* spec,
                                   int device, float* values, size_t count) {
  if (device < 0) {
    return worker->Record(absl::InvalidArgumentError("a device ordinal is >= 0"));
  }
  return Declare(worker, spec, device, values, count);
}

int adaps_worker_local_steps(adaps_worker* worker, int outer) {
  if (outer != 0 && outer != 1) {
    return worker->Record(absl::InvalidArgumentError("outer must be 0 (average) or 1 (nesterov)"));
  }
  if (worker->declared || worker->local_steps) {
    return worker->Record(absl::FailedPreconditionError(
        "adaps_worker_local_steps must come once, before the first declaration"));
  }
  adaps::LocalStepsOptions o;
  o.outer = outer == 1 ? adaps::LocalStepsOptions::Outer::kNesterov
                       : adaps::LocalStepsOptions::Outer::kAverage;
  auto steps = adaps::LocalSteps::Create(worker->worker.get(), o);
  if (!steps.ok()) return worker->Record(steps.status());
  worker->local_steps = *std::move(steps);
  return 0;
}

int adaps_worker_exchange(adaps_worker* worker, const char* name, float* params, size_t count) {
  if (name == nullptr) return worker->Record(absl::InvalidArgumentError("null name"));
  if (params == nullptr && count > 0) {
    return worker->Record(absl::InvalidArgumentError("null params"));
  }
  if (!worker->local_steps) {
    return worker->Record(absl::FailedPreconditionError(
        "adaps_worker_exchange without adaps_worker_local_steps before the declarations"));
  }
  return worker->Record(worker->local_steps->Exchange(name, absl::MakeSpan(params, count)).get());
}

int adaps_worker_push_pull(adaps_worker* worker, const char* name, const float* grad, float* out,
                           size_t count) {
  if (name == nullptr) return worker->Record(absl::InvalidArgumentError("null name"));
  return worker->Record(worker->worker
                            ->PushPull(name, absl::MakeConstSpan(grad, count),
                                       absl::MakeSpan(out, count))
                            .get());
}

int adaps_worker_push_pull_device(adaps_worker* worker, const char* name, const float* grad,
                                  float* out, size_t count, void* stream) {
  if (name == nullptr) return worker->Record(absl::InvalidArgumentError("null name"));
  absl::StatusOr<std::vector<adaps::SliceInfo>> slices = worker->worker->Slices(name);
  if (!slices.ok()) return worker->Record(slices.status());
  uint64_t length = 0;
  for (const adaps::SliceInfo& s : *slices) length += s.length;
  if (count != length) {
    return worker->Record(absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' has ", length, " elements; got ", count)));
  }
  return worker->Record(worker->worker->PushPullOnDevice(name, grad, out, stream).get());
}

int adaps_worker_pull_parameters(adaps_worker* worker, const char* name, float* out,
                                 size_t count) {
  if (name == nullptr) return worker->Record(absl::InvalidArgumentError("null name"));
  if (out == nullptr && count > 0) return worker->Record(absl::InvalidArgumentError("null out"));
  return worker->Record(worker->worker->PullParameters(name, absl::MakeSpan(out, count)));
}

int adaps_worker_barrier(adaps_worker* worker) { return worker->Record(worker->worker->Barrier()); }

int adaps_worker_set_bin_size(adaps_worker* worker, const char* name, uint32_t bin_size) {
  if (name == nullptr) return worker->Record(absl::InvalidArgumentError("null name"));
  return worker->Record(worker->worker->SetBinSize(name, bin_size));
}

int adaps_worker_set_hyper(adaps_worker* worker, const char* name, double value) {
  if (name == nullptr) return worker->Record(absl::InvalidArgumentError("null name"));
  return worker->Record(worker->worker->SetHyper({{name, value}}));
}

int adaps_worker_traffic(const adaps_worker* worker, const char* name, uint64_t* wire_bytes,
                         uint64_t* dense_bytes) {
  auto t = worker->worker->Traffic(name ? name : "");
  if (!t.ok()) return const_cast<adaps_worker*>(worker)->Record(t.status());
  if (wire_bytes) *wire_bytes = t->push_wire_bytes + t->pull_wire_bytes;
  if (dense_bytes) *dense_bytes = t->push_dense_bytes + t->pull_dense_bytes;
  return 0;
}

}  // extern "C"
