// Worker::Impl (worker/worker_impl.h): the parts' wiring, and the tensor table with what
// reads or writes a tensor as a whole.
#include "worker/worker_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "worker/kinds.h"
#include "worker/residue_file.h"

namespace adaps {

Worker::Impl::Impl(const WorkerOptions& options)
    : options_(options),
      log_("worker", options.log_level),
      metrics_(Metrics::Disabled()),
      worker_metrics_(std::make_unique<WorkerMetrics>(*metrics_)),
      devices_(std::make_unique<Devices>(options.emulate_devices, log_)) {}

Worker::Impl::~Impl() { Stop().IgnoreError(); }

absl::Status Worker::Impl::Init() {
  ADAPS_RET_CHECK(!options_.scheduler.empty(), absl::StatusCode::kInvalidArgument,
                  "no scheduler address");
  ADAPS_RET_CHECK(options_.request_timeout > absl::ZeroDuration() &&
                      options_.register_timeout > absl::ZeroDuration() &&
                      options_.scheduler_grace > absl::ZeroDuration(),
                  absl::StatusCode::kInvalidArgument, "timeouts must be positive");
  ADAPS_RETURN_IF_ERROR(ValidateLogLevel(options_.log_level));
  ADAPS_RET_CHECK(options_.compression_threads >= 0 && options_.compression_threads <= 64,
                  absl::StatusCode::kInvalidArgument, "compression_threads must be 0 to 64");
  ADAPS_RETURN_IF_ERROR(StartMetrics());
  membership_ = std::make_unique<Membership>(options_, log_, [this] { return ResidueNorm(); });
  runner_ = std::make_unique<Runner>(options_, log_, *membership_, *worker_metrics_);
  fusion_ = std::make_unique<FusionTable>(options_, log_, *membership_, *runner_, *worker_metrics_);
  Transport& transport = membership_->transport();
  if (options_.metrics_port >= 0) {
    transport.AddTimer(absl::Milliseconds(500),
                       [this] { worker_metrics_->Tick(membership_->transport().stats()); });
  }
  if (options_.fusion_threshold_bytes > 0) {
    transport.AddTimer(absl::Milliseconds(100), [this] { fusion_->Expire(); });
  }
  runner_->Start();
  ADAPS_RETURN_IF_ERROR(membership_->Start());
  worker_metrics_->Bind(membership_->rank());
  return absl::OkStatus();
}

// Serves /metrics from before registration on, so that probes answer while the cluster forms.
absl::Status Worker::Impl::StartMetrics() {
  if (options_.metrics_port < 0) return absl::OkStatus();
  MetricsOptions mopts;
  mopts.port = options_.metrics_port;
  mopts.host = options_.metrics_host;
  mopts.port_file = options_.metrics_port_file;
  mopts.role = "worker";
  mopts.rank = -1;  // until registered (WorkerMetrics::Bind)
  ADAPS_ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics, Metrics::Create(mopts));
  worker_metrics_ = std::make_unique<WorkerMetrics>(*metrics);
  metrics_ = std::move(metrics);
  log_.get()->info("metrics on http://{}:{}/metrics", mopts.host, metrics_->port());
  return absl::OkStatus();
}

absl::Status Worker::Impl::Stop() {
  if (membership_ == nullptr) return absl::OkStatus();  // Init failed its checks
  bool leave = false;
  if (!membership_->BeginStop(&leave)) return absl::OkStatus();
  fusion_->FailStaged(absl::FailedPreconditionError("the worker stopped"));
  absl::Status status;
  if (leave) status = membership_->Leave();
  runner_->CloseRetries();       // a retry posted from now on fails its operation at once
  membership_->StopTransport();  // fails what a retry waits for
  runner_->Stop();
  return status;
}

float Worker::Impl::ResidueNorm() const {
  double sq = 0.0;
  absl::MutexLock lock(&mu_);  // (held briefly everywhere: never across an encode)
  for (const auto& [name, t] : tensors_) sq += t->residue_sq.load(std::memory_order_relaxed);
  return static_cast<float>(std::sqrt(sq));
}

absl::StatusOr<Tensor*> Worker::Impl::Find(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(std::string(name));
  if (it == tensors_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' was not declared"));
  }
  return it->second.get();
}

absl::StatusOr<std::unique_ptr<Tensor>> Worker::Impl::NewTensor(const TensorSpec& spec,
                                                                uint64_t length) {
  ADAPS_ASSIGN_OR_RETURN(auto compressor, MakeTensorCompressor(spec));
  auto tensor = std::make_unique<Tensor>();
  tensor->spec = spec;
  tensor->length = length;
  ADAPS_ASSIGN_OR_RETURN(tensor->device, devices_->For(spec));

  flatbuffers::FlatBufferBuilder fbb(256);
  auto body = msg::CreateDeclareTensor(fbb, fbb.CreateString(spec.name), length, spec.bin_size);
  ADAPS_ASSIGN_OR_RETURN(InMessage reply, membership_->CallScheduler(fbb, body));
  const msg::TensorLayout* layout = reply.envelope()->body_as_TensorLayout();
  ADAPS_RET_CHECK(layout != nullptr && layout->slices() != nullptr && layout->length() == length,
                  absl::StatusCode::kDataLoss, "bad tensor layout from the scheduler");
  tensor->tensor_id = layout->tensor_id();
  const bool dense = spec.compression == Compression::kDense;
  absl::MutexLock lock(&tensor->mu);  // not shared yet; held for the annotations only
  tensor->compressor = std::move(compressor);
  uint64_t covered = 0;
  for (uint32_t i = 0; i < layout->slices()->size(); ++i) {
    const msg::Slice* s = layout->slices()->Get(i);
    ADAPS_RET_CHECK(s->offset() == covered && s->server() >= 0 &&
                        s->server() < membership_->num_servers() && s->length() > 0,
                    absl::StatusCode::kDataLoss, "bad slice in the tensor layout");
    covered += s->length();
    ADAPS_ASSIGN_OR_RETURN(uint64_t key, SliceKey(tensor->tensor_id, i));
    tensor->meta.push_back(SliceMeta{SliceInfo{s->offset(), s->length(), s->server()}, key});
    SliceRt rt;
    if (!dense && tensor->device == nullptr) {
      rt.residue = std::make_unique<SliceState>(s->length());
    }
    tensor->slices.push_back(std::move(rt));
  }
  if (tensor->device != nullptr) ADAPS_RETURN_IF_ERROR(Devices::Place(*tensor));
  ADAPS_RET_CHECK(covered == length, absl::StatusCode::kDataLoss,
                  "tensor layout does not cover the tensor");
  return tensor;
}

// The starting values are rank 0's, or the current ones for a worker that rejoined.
absl::Status Worker::Impl::DeclareSlices(Tensor& t, absl::Span<float> values) {
  const int rank = membership_->rank();
  for (const SliceMeta& m : t.meta) {
    SharedBytes init;
    if (rank == 0) init = FloatsToBytes(values.subspan(m.info.offset, m.info.length));
    // (A server still registering answers kUnavailable: it cannot check our secret yet.)
    ADAPS_RETURN_IF_ERROR(membership_->CallServerResuming(
        m.info.server,
        [&](flatbuffers::FlatBufferBuilder& fbb) {
          return msg::CreateDeclareSlice(
              fbb, m.key, fbb.CreateString(t.spec.name), m.info.length, t.spec.bin_size, rank == 0,
              fbb.CreateString(membership_->Secret()), 0, WirePullFormat(t.spec.pull),
              t.spec.pull_bin_divisor, t.spec.keep_sum);
        },
        init).status());
  }
  // A worker that rejoined a running cluster does not meet the others at this barrier:
  // they are training; it starts from the current parameters below.
  if (!membership_->rejoined()) ADAPS_RETURN_IF_ERROR(membership_->Barrier());
  std::vector<size_t> all(t.meta.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  std::vector<uint64_t> incarnations;
  for (const SliceMeta& m : t.meta) {
    uint64_t incarnation = 0;
    membership_->links().Peer(m.info.server, &incarnation);
    incarnations.push_back(incarnation);
  }
  ADAPS_ASSIGN_OR_RETURN(std::vector<InMessage> pulls,
                         runner_->PullDense(t, all, "initial pull", ReplicaFormat(t.spec.pull)));
  // A worker that joined with TensorSpec::keep_sum starts from the servers' running sum,
  // while its replica of the pulls is the step's mean, as every worker's.
  std::vector<InMessage> sums;
  if (membership_->rejoined() && JoinsFromSum(t.spec)) {
    ADAPS_ASSIGN_OR_RETURN(sums, runner_->PullSums(t, all, &pulls));
  }
  absl::MutexLock lock(&t.mu);
  for (size_t i = 0; i < t.meta.size(); ++i) {
    const SliceInfo& info = t.meta[i].info;
    SliceRt& rt = t.slices[i];
    const InMessage& start = sums.empty() ? pulls[i] : sums[i];
    std::memcpy(values.data() + info.offset, start.payload().data(), start.payload().size());
    if (t.in_place != nullptr) {
      rt.SetReplica(info.length, values.data() + info.offset);
    } else if (KeepsReplica(t.spec.pull)) {
      rt.SetReplica(info.length);
      std::memcpy(rt.replica.data(), pulls[i].payload().data(), info.length * sizeof(float));
    } else {
      rt.SetReplica(0);
    }
    const msg::PullResponse* resp = pulls[i].envelope()->body_as_PullResponse();
    rt.replica_version = ReplicaVersion(*resp);
    rt.step = resp->version();
    rt.seen_version = resp->version();
    rt.incarnation = incarnations[i];
    ADAPS_RETURN_IF_ERROR(UploadReplica(t, i));
  }
  runner_->Track(&t);
  return absl::OkStatus();
}

absl::Status Worker::Impl::Declare(const TensorSpec& spec, absl::Span<float> values) {
  ADAPS_RETURN_IF_ERROR(membership_->CheckRunning());
  ADAPS_RET_CHECK(!spec.name.empty(), absl::StatusCode::kInvalidArgument, "empty tensor name");
  ADAPS_RET_CHECK(!spec.shape.empty(), absl::StatusCode::kInvalidArgument, "empty shape");
  uint64_t length = 1;
  for (int64_t d : spec.shape) {
    ADAPS_RET_CHECK(d > 0, absl::StatusCode::kInvalidArgument, "shape dimensions must be > 0");
    length *= static_cast<uint64_t>(d);
  }
  ADAPS_RET_CHECK(values.size() == length, absl::StatusCode::kInvalidArgument,
                  absl::StrCat("tensor '", spec.name, "': ", values.size(),
                               " initial values for ", length, " elements"));
  if (Find(spec.name).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "' declared twice"));
  }
  ADAPS_RET_CHECK(!(spec.keep_sum && spec.pull_in_place), absl::StatusCode::kInvalidArgument,
                  absl::StrCat("tensor '", spec.name, "': keep_sum is for local mode's update "
                               "exchange, whose trainer steps its parameters itself; "
                               "pull_in_place is for one that only reads them"));
  ADAPS_RET_CHECK(!absl::StartsWith(spec.name, kFusionPrefix), absl::StatusCode::kInvalidArgument,
                  absl::StrCat("tensor names starting with '", kFusionPrefix, "' are reserved"));
  std::unique_ptr<Tensor> tensor;
  bool fused = false;
  if (spec.device < 0 && fusion_->Takes(spec, length)) {
    ADAPS_ASSIGN_OR_RETURN(tensor, FusionTable::NewMember(spec, length));
    ADAPS_RETURN_IF_ERROR(fusion_->Declare(*tensor, values, &fused));
  }
  if (!fused) {
    ADAPS_ASSIGN_OR_RETURN(tensor, NewTensor(spec, length));
    if (spec.pull_in_place) tensor->in_place = values.data();
    ADAPS_RETURN_IF_ERROR(DeclareSlices(*tensor, values));
    worker_metrics_->Attach(*tensor);
  }
  log_.get()->debug("declared '{}' ({} elements, {} slices)", spec.name, length,
                    tensor->meta.size());
  absl::MutexLock lock(&mu_);
  tensors_.emplace(spec.name, std::move(tensor));
  return absl::OkStatus();
}

std::future<absl::Status> Worker::Impl::Run(absl::string_view name, absl::Span<const float> grad,
                                            absl::Span<float> out, bool push, bool pull) {
  if (auto s = membership_->CheckRunning(); !s.ok()) return ReadyFuture(s);
  auto found = Find(name);
  if (!found.ok()) return ReadyFuture(found.status());
  Tensor& t = **found;
  if ((push && grad.size() != t.length) || (pull && out.size() != t.length)) {
    return ReadyFuture(absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' has ", t.length, " elements; got ", push ? grad.size() : out.size())));
  }
  if (pull && t.in_place != nullptr && out.data() != t.in_place) {
    return ReadyFuture(absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' pulls in place (TensorSpec::pull_in_place): `out` must be the "
        "buffer given to Declare")));
  }
  if (auto s = Devices::CheckCall(t, name, /*on_device=*/false); !s.ok()) return ReadyFuture(s);
  if (t.fused_into != nullptr) return fusion_->Run(t, grad, out, push, pull);
  return runner_->Run(t, grad, out, push, pull, nullptr);
}

std::future<absl::Status> Worker::Impl::RunOnDevice(absl::string_view name, const float* grad,
                                                    float* out, bool push, bool pull,
                                                    void* stream) {
  if (auto s = membership_->CheckRunning(); !s.ok()) return ReadyFuture(s);
  auto found = Find(name);
  if (!found.ok()) return ReadyFuture(found.status());
  Tensor& t = **found;
  if (auto s = Devices::CheckCall(t, name, /*on_device=*/true); !s.ok()) return ReadyFuture(s);
  if ((push && grad == nullptr) || (pull && out == nullptr)) {
    return ReadyFuture(absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': null device pointer")));
  }
  // What the trainer gave to its stream so far (its backward pass, writing the gradient):
  // the library's work waits for it.
  absl::StatusOr<std::shared_ptr<DeviceMark>> ready = t.device->Mark(stream);
  if (!ready.ok()) return ReadyFuture(ready.status());
  const absl::Span<const float> g = push ? absl::MakeConstSpan(grad, t.length)
                                         : absl::Span<const float>();
  const absl::Span<float> o = pull ? absl::MakeSpan(out, t.length) : absl::Span<float>();
  return runner_->Run(t, g, o, push, pull, nullptr, /*flush=*/false, *std::move(ready));
}

absl::Status Worker::Impl::PullParameters(absl::string_view name, absl::Span<float> out) {
  ADAPS_RETURN_IF_ERROR(membership_->CheckRunning());
  ADAPS_ASSIGN_OR_RETURN(Tensor * t, Find(name));
  ADAPS_RET_CHECK(out.size() == t->length, absl::StatusCode::kInvalidArgument,
                  absl::StrCat("tensor '", t->spec.name, "' has ", t->length,
                               " elements, the buffer ", out.size()));
  ADAPS_RET_CHECK(t->in_place == nullptr || out.data() != t->in_place,
                  absl::StatusCode::kInvalidArgument,
                  absl::StrCat("tensor '", t->spec.name, "' pulls in place into this buffer (its "
                               "replica): PullParameters needs another one"));
  // A fused tensor is a segment of its bucket's one slice: the bucket is pulled.
  Tensor& src = t->fused_into != nullptr ? t->fused_into->internal : *t;
  const uint64_t at =
      t->fused_into != nullptr ? t->fused_into->members[t->fusion_index].offset : 0;
  std::vector<size_t> all(src.meta.size());
  std::iota(all.begin(), all.end(), size_t{0});
  ADAPS_ASSIGN_OR_RETURN(std::vector<InMessage> pulls,
                         runner_->PullDense(src, all, "parameter pull"));
  uint64_t wire = 0;
  for (size_t i = 0; i < src.meta.size(); ++i) {
    const SliceInfo& info = src.meta[i].info;
    wire += pulls[i].wire_bytes();
    // The part of this slice inside [at, at + t->length) of `src`.
    const uint64_t lo = std::max<uint64_t>(info.offset, at);
    const uint64_t hi = std::min<uint64_t>(info.offset + info.length, at + t->length);
    if (lo >= hi) continue;
    const uint8_t* from = pulls[i].payload().data() + (lo - info.offset) * sizeof(float);
    std::memcpy(out.data() + (lo - at), from, (hi - lo) * sizeof(float));
  }
  {
    absl::MutexLock lock(&src.mu);
    src.traffic.pull_wire_bytes += wire;
    if (&src == t) src.traffic.pull_dense_bytes += t->length * sizeof(float);
    src.metrics.Sync(src.traffic);
  }
  if (&src != t) {  // the bucket's wire bytes are shared by its members (FusedTraffic)
    absl::MutexLock lock(&t->mu);
    t->traffic.pull_dense_bytes += t->length * sizeof(float);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> Worker::Impl::LastSent(absl::string_view name) const {
  ADAPS_ASSIGN_OR_RETURN(Tensor * t, Find(name));
  absl::MutexLock lock(&t->mu);
  if (!t->last_sent.all) return t->last_sent.indices;
  std::vector<uint32_t> every(t->length);
  std::iota(every.begin(), every.end(), 0u);
  return every;
}

namespace {

// Where slice k of `t` lies in the tensor: a fused member has one slice and no layout of its
// own, covering the whole tensor.
std::pair<uint64_t, uint64_t> SliceRange(const Tensor& t, size_t k) {
  if (t.meta.empty()) return {0, t.length};
  return {t.meta[k].info.offset, t.meta[k].info.length};
}

}  // namespace

absl::Status Worker::Impl::Residue(absl::string_view name, absl::Span<float> out) const {
  ADAPS_ASSIGN_OR_RETURN(Tensor * t, Find(name));
  ADAPS_RET_CHECK(out.size() == t->length, absl::StatusCode::kInvalidArgument,
                  absl::StrCat("tensor '", t->spec.name, "' has ", t->length,
                               " elements, the buffer ", out.size()));
  absl::MutexLock lock(&t->mu);
  for (size_t k = 0; k < t->slices.size(); ++k) {
    const auto [offset, length] = SliceRange(*t, k);
    float* to = out.data() + offset;
    if (DeviceResidue* on_device = t->slices[k].device_residue.get(); on_device != nullptr) {
      ADAPS_RETURN_IF_ERROR(on_device->Download(absl::MakeSpan(to, length)));
      continue;
    }
    const SliceState* residue = t->slices[k].residue.get();
    if (residue == nullptr) {
      std::fill(to, to + length, 0.0f);
    } else {
      absl::Span<const float> r = residue->residue();
      std::copy(r.begin(), r.begin() + length, to);
    }
  }
  return absl::OkStatus();
}

absl::Status Worker::Impl::SaveResidues(const std::string& path) const {
  std::vector<TensorResidue> all;
  for (const std::string& name : TensorNames()) {
    ADAPS_ASSIGN_OR_RETURN(Tensor * t, Find(name));
    if (t->spec.compression == Compression::kDense) continue;
    TensorResidue r{name, std::vector<float>(t->length)};
    ADAPS_RETURN_IF_ERROR(Residue(name, absl::MakeSpan(r.residue)));
    all.push_back(std::move(r));
  }
  return ReplaceFileDurably(path, EncodeResidues(all));
}

absl::Status Worker::Impl::LoadResidues(const std::string& path) {
  absl::StatusOr<std::vector<uint8_t>> bytes = ReadFileBytes(path);
  if (!bytes.ok()) return absl::NotFoundError(absl::StrCat("no residue file at ", path));
  ADAPS_ASSIGN_OR_RETURN(std::vector<TensorResidue> all, DecodeResidues(*bytes, path));
  // Every check first: on any error no residue changes.
  std::vector<Tensor*> targets;
  for (const TensorResidue& r : all) {
    absl::StatusOr<Tensor*> t = Find(r.name);
    if (!t.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", r.name, "' is not declared here"));
    }
    if ((*t)->spec.compression == Compression::kDense) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", r.name, "' is sent dense here: it has no residue"));
    }
    if ((*t)->length != r.residue.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", r.name, "' has ",
                                                     r.residue.size(), " elements there and ",
                                                     (*t)->length, " here"));
    }
    targets.push_back(*t);
  }
  for (size_t i = 0; i < all.size(); ++i) {
    ADAPS_RETURN_IF_ERROR(WriteResidue(*targets[i], all[i].residue));
  }
  return absl::OkStatus();
}

absl::Status Worker::Impl::WriteResidue(Tensor& t, absl::Span<const float> values) {
  absl::MutexLock lock(&t.mu);
  for (size_t k = 0; k < t.slices.size(); ++k) {
    if (DeviceResidue* on_device = t.slices[k].device_residue.get(); on_device != nullptr) {
      const uint64_t offset = SliceRange(t, k).first;
      ADAPS_RETURN_IF_ERROR(on_device->Upload(values.subspan(offset, on_device->size())));
      continue;
    }
    SliceState* residue = t.slices[k].residue.get();
    if (residue == nullptr) continue;
    const uint64_t offset = SliceRange(t, k).first;
    residue->Discard();
    absl::Span<float> to = residue->residue();
    std::copy(values.begin() + offset, values.begin() + offset + to.size(), to.begin());
  }
  MeasureResidue(t, /*now_anyway=*/true);
  return absl::OkStatus();
}

absl::Status Worker::Impl::SetResidue(absl::string_view name, absl::Span<const float> values) {
  ADAPS_ASSIGN_OR_RETURN(Tensor * t, Find(name));
  ADAPS_RET_CHECK(t->spec.compression != Compression::kDense, absl::StatusCode::kInvalidArgument,
                  absl::StrCat("tensor '", t->spec.name, "' is sent dense: it has no residue"));
  ADAPS_RET_CHECK(values.size() == t->length, absl::StatusCode::kInvalidArgument,
                  absl::StrCat("tensor '", t->spec.name, "' has ", t->length, " elements, ",
                               values.size(), " residue values given"));
  for (size_t i = 0; i < values.size(); ++i) {
    ADAPS_RET_CHECK(std::isfinite(values[i]), absl::StatusCode::kInvalidArgument,
                    absl::StrCat("residue of '", t->spec.name, "': element ", i,
                                 " is not finite"));
  }
  return WriteResidue(*t, values);
}

absl::Status Worker::Impl::Leave() {
  ADAPS_RETURN_IF_ERROR(membership_->CheckRunning());
  // What holds a residue: each compressed tensor of its own, and each bucket that stepped
  // (its push carries every member's).
  std::vector<Tensor*> targets;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, t] : tensors_) {
      if (t->fused_into == nullptr && t->spec.compression != Compression::kDense) {
        targets.push_back(t.get());
      }
    }
  }
  for (Tensor* holder : fusion_->ResidueHolders()) targets.push_back(holder);
  std::vector<std::vector<float>> zeros(targets.size());
  std::vector<std::future<absl::Status>> pushes;
  for (size_t i = 0; i < targets.size(); ++i) {
    zeros[i].assign(targets[i]->length, 0.0f);
    pushes.push_back(runner_->Run(*targets[i], zeros[i], {}, /*push=*/true, /*pull=*/false, nullptr,
                                  /*flush=*/true));
  }
  absl::Status flushed;
  for (size_t i = 0; i < pushes.size(); ++i) {
    absl::Status st = pushes[i].get();
    if (!st.ok() && flushed.ok()) {
      flushed = absl::Status(st.code(), absl::StrCat("leaving: the residue of '",
                                                     targets[i]->spec.name,
                                                     "' did not reach its server: ",
                                                     st.message()));
    }
  }
  if (!flushed.ok()) log_.get()->error("{}", flushed.ToString());
  absl::Status stopped = Stop();
  return flushed.ok() ? stopped : flushed;
}

absl::Status Worker::Impl::SetBinSize(absl::string_view name, uint32_t bin_size) {
  ADAPS_ASSIGN_OR_RETURN(Tensor * t, Find(name));
  ADAPS_RET_CHECK(t->spec.compression == Compression::kAdaComp,
                  absl::StatusCode::kInvalidArgument,
                  absl::StrCat("tensor '", name, "' is not compressed with AdaComp: it has no "
                               "bin size to set"));
  // The declared spec stays: the servers bin the downlink with it (a fusion bucket's
  // declared table too; its pushes' tables carry each member's bin size of the moment).
  TensorSpec spec = t->spec;
  spec.bin_size = bin_size;
  ADAPS_ASSIGN_OR_RETURN(auto compressor, MakeTensorCompressor(spec));
  ADAPS_ASSIGN_OR_RETURN(std::unique_ptr<DeviceCodec> device_codec,
                         Devices::NewCodec(*t, bin_size));
  absl::MutexLock lock(&t->mu);
  t->compressor = std::move(compressor);
  if (device_codec != nullptr) t->device_codec = std::move(device_codec);
  return absl::OkStatus();
}

absl::Status Worker::Impl::Barrier() { return membership_->Barrier(); }

void Worker::Impl::CloseFusionBuckets() { fusion_->Close(); }

absl::Status Worker::Impl::SetHyper(const std::vector<std::pair<std::string, double>>& params) {
  ADAPS_RETURN_IF_ERROR(membership_->CheckRunning());
  for (int s = 0; s < membership_->num_servers(); ++s) {
    ADAPS_RETURN_IF_ERROR(
        membership_->CallServerResuming(s, [&](flatbuffers::FlatBufferBuilder& fbb) {
          std::vector<flatbuffers::Offset<msg::HyperParam>> ps;
          for (const auto& [n, v] : params) {
            ps.push_back(msg::CreateHyperParam(fbb, fbb.CreateString(n), v));
          }
          return msg::CreateSetHyper(fbb, fbb.CreateVector(ps),
                                     fbb.CreateString(membership_->Secret()));
        }).status());
  }
  return absl::OkStatus();
}

absl::Status Worker::Impl::Checkpoint(const std::string& directory) {
  ADAPS_RETURN_IF_ERROR(membership_->CheckRunning());
  for (int s = 0; s < membership_->num_servers(); ++s) {
    ADAPS_RETURN_IF_ERROR(
        membership_->CallServerResuming(s, [&](flatbuffers::FlatBufferBuilder& fbb) {
          return msg::CreateCheckpoint(fbb, fbb.CreateString(directory),
                                       fbb.CreateString(membership_->Secret()));
        }).status());
  }
  if (directory.empty()) return absl::OkStatus();
  std::error_code error;
  std::filesystem::create_directories(directory, error);  // (an error shows in the write)
  return SaveResidues(ResidueCheckpointPath(directory));
}

std::string Worker::Impl::ResidueCheckpointPath(const std::string& directory) const {
  std::string who =
      options_.identity.empty() ? absl::StrCat("r", membership_->rank()) : options_.identity;
  for (char& c : who) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' &&
        c != '.') {
      c = '_';
    }
  }
  return absl::StrCat(directory, "/worker-", who, ".residues");
}

absl::StatusOr<TrafficCounters> Worker::Impl::Traffic(absl::string_view name) const {
  ADAPS_ASSIGN_OR_RETURN(Tensor * t, Find(name));
  if (t->fused_into != nullptr) return FusedTraffic(*t);
  absl::MutexLock lock(&t->mu);
  return t->traffic;
}

absl::StatusOr<std::vector<SliceInfo>> Worker::Impl::Slices(absl::string_view name) const {
  ADAPS_ASSIGN_OR_RETURN(Tensor * t, Find(name));
  std::vector<SliceInfo> out;
  for (const SliceMeta& m : t->meta) out.push_back(m.info);
  return out;
}

std::vector<std::string> Worker::Impl::TensorNames() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [n, t] : tensors_) names.push_back(n);
  return names;
}

}  // namespace adaps
