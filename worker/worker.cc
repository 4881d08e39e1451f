#include "adaps/worker.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/compressor.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/transport.h"
#include "common/wire_codec.h"

namespace adaps {
namespace {

constexpr int kSchedulerPeer = 0;

// One asynchronous operation over several slices. Completes its promise once: at the first
// error, or when every part has finished. Parts that finish after an error must not touch
// the caller's buffers; they check `finished` (all on the I/O thread, or under mu).
struct Op {
  explicit Op(int parts) : remaining(parts) {}
  void Done(const absl::Status& status) {
    absl::MutexLock lock(&mu);
    if (finished) return;
    if (!status.ok()) {
      finished = true;
      promise.set_value(status);
      return;
    }
    if (--remaining == 0) {
      finished = true;
      promise.set_value(absl::OkStatus());
    }
  }
  bool IsFinished() {
    absl::MutexLock lock(&mu);
    return finished;
  }
  absl::Mutex mu;
  int remaining ABSL_GUARDED_BY(mu);
  bool finished ABSL_GUARDED_BY(mu) = false;
  std::promise<absl::Status> promise;
};

}  // namespace

// The wire encoding of a dense update (common/wire_codec.h: magic, format version, kind,
// index coding, varint length, then the floats), written straight from the gradient: one
// copy instead of two (Compress, then EncodeUpdate). Tested against EncodeUpdate.
static SharedBytes EncodeDenseDirect(absl::Span<const float> grad, IndexCoding coding) {
  auto out = std::make_shared<Bytes>();
  out->reserve(16 + grad.size() * sizeof(float));
  out->push_back(kWireMagic);
  out->push_back(kWireFormatVersion);
  out->push_back(static_cast<uint8_t>(CompressorKind::kDense));
  out->push_back(static_cast<uint8_t>(coding));
  uint64_t v = grad.size();
  while (v >= 0x80) {
    out->push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<uint8_t>(v));
  const uint8_t* begin = reinterpret_cast<const uint8_t*>(grad.data());
  out->insert(out->end(), begin, begin + grad.size() * sizeof(float));
  return out;
}

namespace {

std::future<absl::Status> Ready(absl::Status status) {
  std::promise<absl::Status> p;
  p.set_value(std::move(status));
  return p.get_future();
}

}  // namespace

class Worker::Impl {
 public:
  struct SliceRt {
    SliceInfo info;
    uint64_t key = 0;
    std::unique_ptr<SliceState> residue;
    std::vector<float> replica;  // recompressed pulls: what the server published
    uint64_t replica_version = 0;
    uint64_t step = 0;  // the step this slice pushes next (the server's version)
  };
  struct Tensor {
    TensorSpec spec;
    uint64_t length = 0;
    uint32_t tensor_id = 0;
    std::unique_ptr<Compressor> compressor;
    absl::Mutex mu;
    std::vector<SliceRt> slices ABSL_GUARDED_BY(mu);
    CompressedUpdate update ABSL_GUARDED_BY(mu);
    uint64_t server_generation ABSL_GUARDED_BY(mu) = 0;  // see Impl::server_generation_
    TrafficCounters traffic ABSL_GUARDED_BY(mu);
  };

  explicit Impl(const WorkerOptions& options) : options_(options), log_("worker", options.log_level) {
    TransportOptions topts;
    topts.self = Sender{msg::Role::Worker, -1};
    topts.context = options_.context;
    topts.log = &log_;
    topts.curve.server_public_key = options_.curve_server_public_key;
    topts.curve.client_public_key = options_.curve_public_key;
    topts.curve.client_secret_key = options_.curve_secret_key;
    transport_ = std::make_unique<Transport>(std::move(topts),
                                             [this](InMessage in) { Handle(std::move(in)); });
    transport_->AddTimer(absl::Milliseconds(100), [this] { Heartbeat(); });
  }

  ~Impl() { Stop().IgnoreError(); }

  absl::Status Init() {
    ADAPS_RET_CHECK(!options_.scheduler.empty(), absl::StatusCode::kInvalidArgument,
                    "no scheduler address");
    ADAPS_RET_CHECK(options_.request_timeout > absl::ZeroDuration() &&
                        options_.register_timeout > absl::ZeroDuration(),
                    absl::StatusCode::kInvalidArgument, "timeouts must be positive");
    ADAPS_RETURN_IF_ERROR(ValidateLogLevel(options_.log_level));
    ADAPS_RETURN_IF_ERROR(transport_->Start());
    ADAPS_ASSIGN_OR_RETURN(int peer, transport_->Connect(options_.scheduler));
    ADAPS_RET_CHECK(peer == kSchedulerPeer, absl::StatusCode::kInternal, "unexpected peer id");
    flatbuffers::FlatBufferBuilder fbb(256);
    auto body = msg::CreateRegister(fbb, msg::Role::Worker, fbb.CreateString(""),
                                    fbb.CreateString(options_.identity));
    auto reply = Call(kSchedulerPeer, fbb, body, nullptr, options_.register_timeout);
    if (!reply.ok()) {
      if (reply.status().code() == absl::StatusCode::kUnavailable) {
        return absl::UnavailableError(absl::StrCat("scheduler at ", options_.scheduler,
                                                   " unreachable: ", reply.status().message()));
      }
      if (reply.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return absl::DeadlineExceededError(
            absl::StrCat("no cluster view from the scheduler at ", options_.scheduler,
                         " within ", absl::FormatDuration(options_.register_timeout)));
      }
      return reply.status();
    }
    const msg::ClusterView* view = reply->envelope()->body_as_ClusterView();
    ADAPS_RET_CHECK(view != nullptr, absl::StatusCode::kDataLoss,
                    "scheduler answered Register with something else");
    rank_ = view->your_rank();
    num_workers_ = view->num_workers();
    num_servers_ = view->num_servers();
    heartbeat_interval_ms_ = std::max<uint32_t>(10, view->heartbeat_interval_ms());
    transport_->SetRank(rank_);
    log_.SetRank(rank_);
    std::vector<std::string> addresses(num_servers_);
    if (view->nodes()) {
      for (const auto* n : *view->nodes()) {
        if (n->role() == msg::Role::Server && n->rank() >= 0 && n->rank() < num_servers_ &&
            n->address()) {
          addresses[n->rank()] = n->address()->str();
        }
      }
    }
    for (int s = 0; s < num_servers_; ++s) {
      ADAPS_RET_CHECK(!addresses[s].empty(), absl::StatusCode::kDataLoss,
                      absl::StrCat("cluster view without an address for server ", s));
      ADAPS_ASSIGN_OR_RETURN(int p, transport_->Connect(addresses[s]));
      absl::MutexLock lock(&mu_);
      server_peer_.push_back(p);
    }
    server_address_ = addresses;
    rejoined_ = view->rejoined();
    barrier_seq_ = view->next_barrier();
    if (rejoined_) {
      log_.get()->info("rejoined a running cluster at barrier {}", view->next_barrier());
    }
    {
      absl::MutexLock lock(&mu_);
      last_heartbeat_ok_ = absl::Now();
      epoch_ = view->epoch();
    }
    log_.get()->info("registered: worker {} of {}, {} servers", rank_, num_workers_, num_servers_);
    return absl::OkStatus();
  }

  int rank() const { return rank_; }
  int num_workers() const { return num_workers_; }
  int num_servers() const { return num_servers_; }

  template <typename T>
  absl::StatusOr<InMessage> Call(int peer, flatbuffers::FlatBufferBuilder& fbb,
                                 flatbuffers::Offset<T> body, SharedBytes payload,
                                 absl::Duration timeout) {
    const uint64_t id = transport_->NewRequestId();
    auto promise = std::make_shared<std::promise<absl::StatusOr<InMessage>>>();
    auto future = promise->get_future();
    transport_->Request(peer, id,
                        FinishEnvelope(fbb, transport_->self(), body, id, 0, std::move(payload)),
                        absl::Now() + timeout, [promise](absl::StatusOr<InMessage> reply) {
                          promise->set_value(std::move(reply));
                        });
    // The transport answers every request by its deadline; the margin only guards a bug.
    if (future.wait_for(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout) + 5000)) !=
        std::future_status::ready) {
      return absl::DeadlineExceededError("request not answered");
    }
    return future.get();
  }

  absl::Status CheckRunning() {
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::FailedPreconditionError("worker stopped");
    if (shutdown_) return shutdown_status_;
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor*> Find(absl::string_view name) const {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(std::string(name));
    if (it == tensors_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' was not declared"));
    }
    return it->second.get();
  }

  absl::Status Declare(const TensorSpec& spec, absl::Span<float> values) {
    ADAPS_RETURN_IF_ERROR(CheckRunning());
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
    CompressorOptions copts;
    copts.kind = static_cast<CompressorKind>(spec.compression);
    copts.bin_size = spec.bin_size;
    copts.topk_fraction = spec.topk_fraction;
    ADAPS_RETURN_IF_ERROR(ValidateOptions(copts));
    ADAPS_RET_CHECK(spec.bin_size > 0, absl::StatusCode::kInvalidArgument, "bin size is zero");

    auto tensor = std::make_unique<Tensor>();
    tensor->spec = spec;
    tensor->length = length;
    ADAPS_ASSIGN_OR_RETURN(tensor->compressor, MakeCompressor(copts));

    flatbuffers::FlatBufferBuilder fbb(256);
    auto body = msg::CreateDeclareTensor(fbb, fbb.CreateString(spec.name), length, spec.bin_size);
    ADAPS_ASSIGN_OR_RETURN(InMessage reply,
                           Call(kSchedulerPeer, fbb, body, nullptr, options_.request_timeout));
    const msg::TensorLayout* layout = reply.envelope()->body_as_TensorLayout();
    ADAPS_RET_CHECK(layout != nullptr && layout->slices() != nullptr && layout->length() == length,
                    absl::StatusCode::kDataLoss, "bad tensor layout from the scheduler");
    tensor->tensor_id = layout->tensor_id();
    absl::MutexLock tlock(&tensor->mu);
    uint64_t covered = 0;
    for (uint32_t i = 0; i < layout->slices()->size(); ++i) {
      const msg::Slice* s = layout->slices()->Get(i);
      ADAPS_RET_CHECK(s->offset() == covered && s->server() >= 0 && s->server() < num_servers_ &&
                          s->length() > 0,
                      absl::StatusCode::kDataLoss, "bad slice in the tensor layout");
      covered += s->length();
      SliceRt rt;
      rt.info = SliceInfo{s->offset(), s->length(), s->server()};
      rt.key = (uint64_t{tensor->tensor_id} << 24) | i;
      rt.residue = std::make_unique<SliceState>(s->length());
      tensor->slices.push_back(std::move(rt));
    }
    ADAPS_RET_CHECK(covered == length, absl::StatusCode::kDataLoss,
                    "tensor layout does not cover the tensor");
    // Create the slices on the servers (rank 0 sends the initial values).
    for (const auto& rt : tensor->slices) {
      flatbuffers::FlatBufferBuilder b(256);
      auto d = msg::CreateDeclareSlice(b, rt.key, b.CreateString(spec.name), rt.info.length,
                                       spec.bin_size, rank_ == 0);
      SharedBytes init;
      if (rank_ == 0) init = FloatsToBytes(values.subspan(rt.info.offset, rt.info.length));
      ADAPS_RETURN_IF_ERROR(Call(ServerPeer(rt.info.server), b, d, std::move(init),
                                 options_.request_timeout)
                                .status());
    }
    // A worker that rejoined a running cluster does not meet the others at this barrier:
    // they are training; it starts from the current parameters below.
    if (!rejoined_) ADAPS_RETURN_IF_ERROR(Barrier());
    // Everyone starts from rank 0's values (a rejoined worker: from the current ones).
    for (auto& rt : tensor->slices) {
      flatbuffers::FlatBufferBuilder b(128);
      auto p = msg::CreatePullRequest(b, rt.key, 0, 0, msg::PullFormat::Dense);
      ADAPS_ASSIGN_OR_RETURN(InMessage r, Call(ServerPeer(rt.info.server), b, p, nullptr,
                                               options_.request_timeout));
      const msg::PullResponse* resp = r.envelope()->body_as_PullResponse();
      ADAPS_RET_CHECK(resp != nullptr && r.payload().size() == uint64_t{rt.info.length} * 4,
                      absl::StatusCode::kDataLoss, "bad initial pull");
      std::memcpy(values.data() + rt.info.offset, r.payload().data(), r.payload().size());
      rt.replica.assign(values.begin() + rt.info.offset,
                        values.begin() + rt.info.offset + rt.info.length);
      rt.replica_version = resp->version();
      rt.step = resp->version();
    }
    tensor->server_generation = server_generation_.load();
    log_.get()->debug("declared '{}' ({} elements, {} slices)", spec.name, length,
                      tensor->slices.size());
    absl::MutexLock lock(&mu_);
    tensors_.emplace(spec.name, std::move(tensor));
    return absl::OkStatus();
  }

  // Sends the pushes of one step; every slice reports to `op`.
  absl::Status StartPush(Tensor& t, absl::Span<const float> grad, const std::shared_ptr<Op>& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
    if (!AllFinite(grad)) {
      // Checked up front so no residue of any slice changes.
      return absl::InvalidArgumentError(
          absl::StrCat("gradient of '", t.spec.name, "' holds NaN or Inf"));
    }
    const IndexCoding coding = options_.compact_indices ? IndexCoding::kRice : IndexCoding::kPlain32;
    std::vector<std::pair<SharedBytes, size_t>> encoded;
    for (auto& rt : t.slices) {
      if (t.spec.compression == Compression::kDense) {
        encoded.emplace_back(
            EncodeDenseDirect(grad.subspan(rt.info.offset, rt.info.length), coding), 0);
        continue;
      }
      ADAPS_RETURN_IF_ERROR(t.compressor->Compress(grad.subspan(rt.info.offset, rt.info.length),
                                                   *rt.residue, t.update));
      auto bytes = std::make_shared<Bytes>();
      ADAPS_RETURN_IF_ERROR(EncodeUpdate(t.update, coding, bytes.get()));
      encoded.emplace_back(std::move(bytes), 0);
    }
    for (size_t i = 0; i < t.slices.size(); ++i) {
      SliceRt& rt = t.slices[i];
      const uint64_t step = rt.step++;
      flatbuffers::FlatBufferBuilder fbb(128);
      auto body = msg::CreatePush(fbb, rt.key, step,
                                  static_cast<msg::PayloadKind>(t.spec.compression));
      const uint64_t id = transport_->NewRequestId();
      OutMessage m = FinishEnvelope(fbb, transport_->self(), body, id, 0, encoded[i].first);
      t.traffic.push_wire_bytes += m.header.size() + encoded[i].first->size();
      t.traffic.push_dense_bytes += uint64_t{rt.info.length} * sizeof(float);
      transport_->Request(ServerPeer(rt.info.server), id, std::move(m),
                          absl::Now() + options_.request_timeout,
                          [op, name = t.spec.name](absl::StatusOr<InMessage> reply) {
                            if (!reply.ok()) {
                              op->Done(absl::Status(reply.status().code(),
                                                    absl::StrCat("push of '", name, "': ",
                                                                 reply.status().message())));
                            } else {
                              op->Done(absl::OkStatus());
                            }
                          });
    }
    ++t.traffic.pushes;
    return absl::OkStatus();
  }

  void StartPull(Tensor& t, absl::Span<float> out, const std::shared_ptr<Op>& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
    const bool recompressed = t.spec.pull == PullFormat::kRecompressed;
    for (size_t i = 0; i < t.slices.size(); ++i) {
      const SliceRt& rt = t.slices[i];
      flatbuffers::FlatBufferBuilder fbb(128);
      auto body = msg::CreatePullRequest(
          fbb, rt.key, rt.step, rt.replica_version,
          recompressed ? msg::PullFormat::Recompressed : msg::PullFormat::Dense);
      const uint64_t id = transport_->NewRequestId();
      OutMessage m = FinishEnvelope(fbb, transport_->self(), body, id, 0);
      const size_t request_bytes = m.header.size();
      Tensor* tp = &t;
      transport_->Request(
          ServerPeer(rt.info.server), id, std::move(m), absl::Now() + options_.request_timeout,
          [op, tp, i, out, request_bytes](absl::StatusOr<InMessage> reply) {
            if (!reply.ok()) {
              op->Done(absl::Status(reply.status().code(),
                                    absl::StrCat("pull of '", tp->spec.name, "': ",
                                                 reply.status().message())));
              return;
            }
            if (op->IsFinished()) return;  // an earlier part failed: leave `out` alone
            op->Done(ApplyPull(*tp, i, *reply, out, request_bytes));
          });
    }
    ++t.traffic.pulls;
  }

  // On the I/O thread: writes one slice of a pull answer into `out`.
  static absl::Status ApplyPull(Tensor& t, size_t i, const InMessage& reply, absl::Span<float> out,
                                size_t request_bytes) {
    const msg::PullResponse* resp = reply.envelope()->body_as_PullResponse();
    if (resp == nullptr) return absl::DataLossError("pull answered with something else");
    absl::MutexLock lock(&t.mu);
    SliceRt& rt = t.slices[i];
    t.traffic.pull_wire_bytes += reply.wire_bytes() + request_bytes;
    t.traffic.pull_dense_bytes += uint64_t{rt.info.length} * sizeof(float);
    float* dst = out.data() + rt.info.offset;
    if (resp->format() == msg::PullFormat::Dense) {
      if (reply.payload().size() != uint64_t{rt.info.length} * sizeof(float)) {
        return absl::DataLossError("dense pull of the wrong size");
      }
      std::memcpy(dst, reply.payload().data(), reply.payload().size());
      return absl::OkStatus();
    }
    if (resp->base_version() != rt.replica_version) {
      return absl::DataLossError(absl::StrCat("recompressed pull from version ",
                                              resp->base_version(), " but replica is at ",
                                              rt.replica_version));
    }
    if (!reply.payload().empty()) {
      ADAPS_RETURN_IF_ERROR(DecodeAdd(reply.payload(), 1.0f, absl::MakeSpan(rt.replica)));
    }
    rt.replica_version = resp->version();
    std::memcpy(dst, rt.replica.data(), rt.replica.size() * sizeof(float));
    return absl::OkStatus();
  }

  std::future<absl::Status> Run(absl::string_view name, const float* grad, size_t grad_size,
                                float* out, size_t out_size, bool push, bool pull) {
    if (auto s = CheckRunning(); !s.ok()) return Ready(s);
    auto found = Find(name);
    if (!found.ok()) return Ready(found.status());
    Tensor& t = **found;
    if ((push && grad_size != t.length) || (pull && out_size != t.length)) {
      return Ready(absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "' has ", t.length, " elements; got ", push ? grad_size : out_size)));
    }
    absl::MutexLock lock(&t.mu);
    if (t.server_generation != server_generation_.load()) {
      if (auto s = Resync(t); !s.ok()) return Ready(s);
    }
    const int parts = static_cast<int>(t.slices.size()) * ((push ? 1 : 0) + (pull ? 1 : 0));
    auto op = std::make_shared<Op>(parts);
    auto future = op->promise.get_future();
    if (push) {
      if (auto s = StartPush(t, absl::MakeConstSpan(grad, grad_size), op); !s.ok()) {
        return Ready(s);
      }
    }
    if (pull) StartPull(t, absl::MakeSpan(out, out_size), op);
    return future;
  }

  // After a server restarted (restored from its checkpoint, possibly at an earlier step):
  // learn each slice's current step and parameters, so the next push is for the step the
  // server is at and recompressed pulls start from its state.
  absl::Status Resync(Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
    const uint64_t generation = server_generation_.load();
    for (auto& rt : t.slices) {
      flatbuffers::FlatBufferBuilder b(128);
      auto p = msg::CreatePullRequest(b, rt.key, 0, 0, msg::PullFormat::Dense);
      ADAPS_ASSIGN_OR_RETURN(InMessage r, Call(ServerPeer(rt.info.server), b, p, nullptr,
                                               options_.request_timeout));
      const msg::PullResponse* resp = r.envelope()->body_as_PullResponse();
      ADAPS_RET_CHECK(resp != nullptr && r.payload().size() == uint64_t{rt.info.length} * 4,
                      absl::StatusCode::kDataLoss, "bad pull while resynchronizing");
      if (resp->version() != rt.step) {
        log_.get()->warn("tensor '{}' slice at {}: server at step {}, this worker at {}",
                         t.spec.name, rt.info.offset, resp->version(), rt.step);
      }
      rt.step = resp->version();
      std::memcpy(rt.replica.data(), r.payload().data(), r.payload().size());
      rt.replica_version = resp->version();
    }
    t.server_generation = generation;
    return absl::OkStatus();
  }

  int ServerPeer(int server) const {
    absl::MutexLock lock(&mu_);
    return server_peer_[server];
  }

  absl::Status Barrier() {
    ADAPS_RETURN_IF_ERROR(CheckRunning());
    flatbuffers::FlatBufferBuilder fbb(64);
    auto body = msg::CreateBarrier(fbb, barrier_seq_.fetch_add(1));
    return Call(kSchedulerPeer, fbb, body, nullptr, options_.request_timeout).status();
  }

  absl::Status SetHyper(const std::vector<std::pair<std::string, double>>& params) {
    ADAPS_RETURN_IF_ERROR(CheckRunning());
    for (int s = 0; s < num_servers_; ++s) {
      flatbuffers::FlatBufferBuilder fbb(256);
      std::vector<flatbuffers::Offset<msg::HyperParam>> ps;
      for (const auto& [n, v] : params) {
        ps.push_back(msg::CreateHyperParam(fbb, fbb.CreateString(n), v));
      }
      auto body = msg::CreateSetHyper(fbb, fbb.CreateVector(ps));
      ADAPS_RETURN_IF_ERROR(
          Call(ServerPeer(s), fbb, body, nullptr, options_.request_timeout).status());
    }
    return absl::OkStatus();
  }

  absl::Status Checkpoint(const std::string& directory) {
    ADAPS_RETURN_IF_ERROR(CheckRunning());
    for (int s = 0; s < num_servers_; ++s) {
      flatbuffers::FlatBufferBuilder fbb(256);
      auto body = msg::CreateCheckpoint(fbb, fbb.CreateString(directory));
      ADAPS_RETURN_IF_ERROR(
          Call(ServerPeer(s), fbb, body, nullptr, options_.request_timeout).status());
    }
    return absl::OkStatus();
  }

  absl::StatusOr<TrafficCounters> Traffic(absl::string_view name) const {
    ADAPS_ASSIGN_OR_RETURN(Tensor * t, Find(name));
    absl::MutexLock lock(&t->mu);
    return t->traffic;
  }

  absl::StatusOr<std::vector<SliceInfo>> Slices(absl::string_view name) const {
    ADAPS_ASSIGN_OR_RETURN(Tensor * t, Find(name));
    absl::MutexLock lock(&t->mu);
    std::vector<SliceInfo> out;
    for (const auto& rt : t->slices) out.push_back(rt.info);
    return out;
  }

  std::vector<std::string> TensorNames() const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> names;
    for (const auto& [n, t] : tensors_) names.push_back(n);
    return names;
  }

  absl::Status Stop() {
    bool leave = false;
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return absl::OkStatus();
      stopped_ = true;
      leave = rank_ >= 0 && !shutdown_;
    }
    absl::Status status;
    if (leave) {
      flatbuffers::FlatBufferBuilder fbb(64);
      auto body = msg::CreateLeave(fbb);
      status = Call(kSchedulerPeer, fbb, body, nullptr, absl::Seconds(2)).status();
    }
    transport_->Stop();
    return status;
  }

 private:
  void Handle(InMessage in) {
    const msg::Envelope* env = in.envelope();
    const bool scheduler_only =
        env->body_type() == msg::Body::Shutdown || env->body_type() == msg::Body::ClusterView;
    if (scheduler_only && in.peer() != kSchedulerPeer) {
      log_.get()->warn("ignored a {} that did not come from the scheduler",
                       msg::EnumNameBody(env->body_type()));
      return;
    }
    if (env->body_type() == msg::Body::Shutdown) {
      const msg::Shutdown* sd = env->body_as_Shutdown();
      const std::string reason = sd->reason() ? sd->reason()->str() : "";
      log_.get()->info("the scheduler shut the cluster down: {}", reason);
      {
        absl::MutexLock lock(&mu_);
        shutdown_ = true;
        const int code = sd->code();
        shutdown_status_ =
            code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                ? absl::Status(static_cast<absl::StatusCode>(code),
                               absl::StrCat("the cluster was stopped: ", reason))
                : absl::FailedPreconditionError("the cluster has shut down");
      }
      // Nothing in flight will be answered now: fail it at once with the reason.
      std::vector<int> peers;
      {
        absl::MutexLock lock(&mu_);
        peers = server_peer_;
      }
      for (int peer : peers) {
        transport_->FailPeer(peer, absl::AbortedError(
                                       absl::StrCat("the cluster was shut down: ", reason)));
      }
      return;
    }
    if (env->body_type() == msg::Body::ClusterView) {
      OnView(env->body_as_ClusterView());
      return;
    }
    if (env->request_id()) {
      transport_->Reply(in, MakeError(transport_->self(), env->request_id(),
                                      absl::InvalidArgumentError("workers take no requests")));
    }
  }

  // On the I/O thread: a newer cluster view. Fails requests to servers declared dead, and
  // reconnects to a server that came back at another address (restarted): requests still
  // queued for the old address fail with kUnavailable, and every tensor resynchronizes its
  // steps with the servers before its next operation.
  void OnView(const msg::ClusterView* view) {
    {
      absl::MutexLock lock(&mu_);
      if (view->epoch() < epoch_) return;
      epoch_ = view->epoch();
    }
    if (view->nodes() == nullptr) return;
    for (const auto* n : *view->nodes()) {
      if (n->role() != msg::Role::Server || n->rank() < 0 || n->rank() >= num_servers_) continue;
      const int r = n->rank();
      if (!n->alive()) {
        log_.get()->warn("server {} declared dead", r);
        transport_->FailPeer(ServerPeer(r), absl::UnavailableError(
                                                absl::StrCat("server ", r, " declared dead")));
        continue;
      }
      const std::string address = n->address() ? n->address()->str() : "";
      if (address.empty() || address == server_address_[r]) continue;
      auto peer = transport_->Connect(address);
      if (!peer.ok()) {
        log_.get()->error("server {} moved to {}: {}", r, address, peer.status().ToString());
        continue;
      }
      log_.get()->warn("server {} restarted at {}: reconnected", r, address);
      int old;
      {
        absl::MutexLock lock(&mu_);
        old = server_peer_[r];
        server_peer_[r] = *peer;
        server_address_[r] = address;
      }
      ++server_generation_;
      transport_->FailPeer(old, absl::UnavailableError(absl::StrCat("server ", r, " restarted")));
    }
  }

  // On the I/O thread: the scheduler does not know us (it restarted). Register again with
  // our identity, rank and epoch; training goes on meanwhile on the view we have.
  void Reregister() {
    if (reregistering_) return;
    reregistering_ = true;
    log_.get()->warn("the scheduler does not know this worker: registering again as rank {}",
                     rank_);
    uint32_t epoch;
    {
      absl::MutexLock lock(&mu_);
      epoch = epoch_;
    }
    flatbuffers::FlatBufferBuilder fbb(256);
    auto body = msg::CreateRegister(fbb, msg::Role::Worker, fbb.CreateString(""),
                                    fbb.CreateString(options_.identity), rank_, epoch);
    const uint64_t id = transport_->NewRequestId();
    transport_->Request(kSchedulerPeer, id, FinishEnvelope(fbb, transport_->self(), body, id, 0),
                        absl::Now() + options_.register_timeout,
                        [this](absl::StatusOr<InMessage> reply) {
                          reregistering_ = false;
                          if (!reply.ok() ||
                              reply->envelope()->body_type() != msg::Body::ClusterView) {
                            return;
                          }
                          OnView(reply->envelope()->body_as_ClusterView());
                          log_.get()->info("registered again with the scheduler");
                        });
  }

  void Heartbeat() {
    if (rank_ < 0) return;
    const absl::Time now = absl::Now();
    if (now - last_heartbeat_sent_ < absl::Milliseconds(heartbeat_interval_ms_)) return;
    last_heartbeat_sent_ = now;
    flatbuffers::FlatBufferBuilder fbb(64);
    auto body = msg::CreateHeartbeat(fbb, 0);
    const uint64_t id = transport_->NewRequestId();
    transport_->Request(kSchedulerPeer, id, FinishEnvelope(fbb, transport_->self(), body, id, 0),
                        now + absl::Milliseconds(2 * heartbeat_interval_ms_),
                        [this](absl::StatusOr<InMessage> reply) {
                          if (!reply.ok()) {
                            if (reply.status().code() == absl::StatusCode::kFailedPrecondition) {
                              Reregister();
                            }
                            return;
                          }
                          absl::MutexLock lock(&mu_);
                          last_heartbeat_ok_ = absl::Now();
                        });
  }

  const WorkerOptions options_;
  RoleLog log_;
  std::unique_ptr<Transport> transport_;
  // Set in Init, read-only afterwards.
  int rank_ = -1;
  int num_workers_ = 0;
  int num_servers_ = 0;
  uint32_t heartbeat_interval_ms_ = 1000;
  std::vector<int> server_peer_ ABSL_GUARDED_BY(mu_);        // changes when a server moves
  std::vector<std::string> server_address_;  // I/O thread (and Init)
  std::atomic<uint64_t> server_generation_{0};  // bumped when a server moved
  bool rejoined_ = false;       // set in Init: we re-registered into a formed cluster
  bool reregistering_ = false;  // I/O thread only
  std::atomic<uint64_t> barrier_seq_{0};
  absl::Time last_heartbeat_sent_;  // I/O thread only

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Tensor>> tensors_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status shutdown_status_ ABSL_GUARDED_BY(mu_);
  uint32_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_heartbeat_ok_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const WorkerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  ADAPS_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Worker>(new Worker(std::move(impl)));
}

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Worker::~Worker() = default;

int Worker::rank() const { return impl_->rank(); }
int Worker::num_workers() const { return impl_->num_workers(); }
int Worker::num_servers() const { return impl_->num_servers(); }

absl::Status Worker::Declare(const TensorSpec& spec, absl::Span<float> values) {
  return impl_->Declare(spec, values);
}

std::future<absl::Status> Worker::PushPull(absl::string_view name, absl::Span<const float> grad,
                                           absl::Span<float> out) {
  return impl_->Run(name, grad.data(), grad.size(), out.data(), out.size(), true, true);
}

std::future<absl::Status> Worker::Push(absl::string_view name, absl::Span<const float> grad) {
  return impl_->Run(name, grad.data(), grad.size(), nullptr, 0, true, false);
}

std::future<absl::Status> Worker::Pull(absl::string_view name, absl::Span<float> out) {
  return impl_->Run(name, nullptr, 0, out.data(), out.size(), false, true);
}

absl::Status Worker::Barrier() { return impl_->Barrier(); }
absl::Status Worker::SetHyper(const std::vector<std::pair<std::string, double>>& params) {
  return impl_->SetHyper(params);
}
absl::Status Worker::Checkpoint(const std::string& directory) {
  return impl_->Checkpoint(directory);
}
absl::StatusOr<TrafficCounters> Worker::Traffic(absl::string_view name) const {
  return impl_->Traffic(name);
}
absl::StatusOr<std::vector<SliceInfo>> Worker::Slices(absl::string_view name) const {
  return impl_->Slices(name);
}
std::vector<std::string> Worker::TensorNames() const { return impl_->TensorNames(); }
absl::Status Worker::Stop() { return impl_->Stop(); }

}  // namespace adaps
