// The runner (worker/run.h): the stages of an operation, from the caller to its future.
#include "worker/run.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/bucket.h"
#include "worker/kinds.h"

namespace adaps {
namespace {

void Fulfil(RunOp& op, const absl::Status& status) {
  absl::MutexLock lock(&op.mu);
  op.Settle(status);
}

}  // namespace

Runner::Runner(const WorkerOptions& options, const RoleLog& log, Membership& membership,
               WorkerMetrics& metrics)
    : options_(options),
      log_(log),
      membership_(membership),
      transport_(membership.transport()),
      links_(membership.links()),
      metrics_(metrics) {}

void Runner::Start() {
  retries_.Start();
  // (The I/O thread calls it; the transport stops before this Runner goes.)
  links_.SetOnRestart(
      [this](int server) { retries_.Post([this, server] { AnnounceSeen(server); }); });
  if (options_.compression_threads > 0) {
    pool_ = std::make_unique<JobPool>(options_.compression_threads);
    pool_->Start();
  }
}

void Runner::CloseRetries() { retries_.Close(); }

void Runner::Track(Tensor* t) {
  absl::MutexLock lock(&tracked_mu_);
  tracked_.push_back(t);
}

void Runner::AnnounceSeen(int server) {
  std::vector<Tensor*> tensors;
  {
    absl::MutexLock lock(&tracked_mu_);
    tensors = tracked_;
  }
  std::vector<std::pair<uint64_t, uint64_t>> seen;  // key, version
  for (Tensor* t : tensors) {
    absl::MutexLock lock(&t->mu);
    for (size_t i = 0; i < t->meta.size(); ++i) {
      if (t->meta[i].info.server != server || t->slices[i].seen_version == 0) continue;
      seen.emplace_back(t->meta[i].key, t->slices[i].seen_version);
    }
  }
  for (const std::pair<uint64_t, uint64_t>& slice : seen) {
    if (!membership_.CheckRunning().ok()) return;
    absl::Status st = membership_
                          .CallServerResuming(server,
                                              [&](flatbuffers::FlatBufferBuilder& b) {
                                                return msg::CreateResume(b, slice.first,
                                                                         slice.second);
                                              })
                          .status();
    if (!st.ok()) {
      // (A server that restarted again is told by the next announcement.)
      log_.get()->warn("telling restarted server {} the steps this worker saw: {}", server,
                       st.ToString());
      return;
    }
  }
}

void Runner::Stop() {
  retries_.Stop();
  if (pool_ != nullptr) pool_->Stop();  // queued Runs fail ("worker stopped"), decodes finish
}

// Blocking dense pulls of `slices` at their current version; called with no lock held.
absl::StatusOr<std::vector<InMessage>> Runner::PullDense(const Tensor& t,
                                                         const std::vector<size_t>& slices,
                                                         const char* why, msg::PullFormat format) {
  std::vector<InMessage> out;
  for (size_t i : slices) {
    const SliceMeta& m = t.meta[i];
    // A server that restarts meanwhile is asked again (its checkpoint has the slice): a
    // joiner's initial pull failed with "server 0 restarted" when its server was killed
    // just after the declaration (bench/cluster/grow_under_faults.sh).
    ADAPS_ASSIGN_OR_RETURN(InMessage r, membership_.CallServerResuming(
                                            m.info.server, [&](flatbuffers::FlatBufferBuilder& b) {
                                              return msg::CreatePullRequest(b, m.key, 0, 0, format);
                                            }));
    ADAPS_RET_CHECK(r.envelope()->body_as_PullResponse() != nullptr &&
                        r.payload().size() == uint64_t{m.info.length} * sizeof(float),
                    absl::StatusCode::kDataLoss, absl::StrCat("bad ", why));
    out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<std::vector<InMessage>> Runner::PullSums(const Tensor& t,
                                                        const std::vector<size_t>& slices,
                                                        std::vector<InMessage>* pulls) {
  auto version = [](const InMessage& m) { return m.envelope()->body_as_PullResponse()->version(); };
  constexpr int kTries = 5;
  for (int attempt = 1;; ++attempt) {
    ADAPS_ASSIGN_OR_RETURN(std::vector<InMessage> sums,
                           PullDense(t, slices, "running sum pull", msg::PullFormat::Replica));
    bool same = true;
    for (size_t k = 0; k < slices.size(); ++k) same = same && version(sums[k]) == version((*pulls)[k]);
    if (same) return sums;
    if (attempt == kTries) {
      return absl::UnavailableError(absl::StrCat(
          "tensor '", t.spec.name, "': the job stepped between each of ", kTries,
          " pulls of its parameters and of the servers' running sum; join again"));
    }
    ADAPS_ASSIGN_OR_RETURN(*pulls, PullDense(t, slices, "initial pull", ReplicaFormat(t.spec.pull)));
  }
}

std::vector<size_t> Runner::StaleSlices(Tensor& t) {
  const std::vector<uint64_t> now = links_.Incarnations();
  std::vector<size_t> stale;
  absl::MutexLock lock(&t.mu);
  for (size_t i = 0; i < t.meta.size(); ++i) {
    if (t.slices[i].incarnation != now[t.meta[i].info.server]) stale.push_back(i);
  }
  return stale;
}

// The pulls run without t.mu (an I/O callback may need it meanwhile); the answers are
// applied under it afterwards. A slice whose server moved again meanwhile stays stale.
absl::Status Runner::ResyncSlices(Tensor& t, const std::vector<size_t>& slices) {
  std::vector<uint64_t> incarnations;
  for (size_t i : slices) {
    uint64_t incarnation = 0;
    links_.Peer(t.meta[i].info.server, &incarnation);
    incarnations.push_back(incarnation);
  }
  ADAPS_ASSIGN_OR_RETURN(
      std::vector<InMessage> pulls,
      PullDense(t, slices, "pull while resynchronizing", ReplicaFormat(t.spec.pull)));
  absl::MutexLock lock(&t.mu);
  for (size_t k = 0; k < slices.size(); ++k) {
    SliceRt& rt = t.slices[slices[k]];
    const uint64_t version = pulls[k].envelope()->body_as_PullResponse()->version();
    if (version != rt.step) {
      log_.get()->warn("tensor '{}' slice at {}: restored server at step {}, this worker at {}",
                       t.spec.name, t.meta[slices[k]].info.offset, version, rt.step);
    }
    // Never back: the restored shard takes the workers' steps (server/shard.h, AddPush), so
    // the next push keeps this slice's step. A pull alone takes the restored parameters.
    if (version < rt.step) rt.pull_floor = version;
    rt.step = std::max(rt.step, version);
    if (!rt.replica.empty()) {  // (a tensor with dense pulls keeps none)
      std::memcpy(rt.replica.data(), pulls[k].payload().data(), pulls[k].payload().size());
    }
    rt.replica_version = ReplicaVersion(*pulls[k].envelope()->body_as_PullResponse());
    rt.seen_version = version;
    rt.incarnation = incarnations[k];
    ADAPS_RETURN_IF_ERROR(UploadReplica(t, slices[k]));
  }
  return absl::OkStatus();
}

absl::Status Runner::ResyncWithin(Tensor& t, const std::vector<size_t>& slices,
                                  absl::Time deadline) {
  while (true) {
    absl::Status s = ResyncSlices(t, slices);
    if (s.code() != absl::StatusCode::kUnavailable || absl::Now() >= deadline) return s;
    ADAPS_RETURN_IF_ERROR(membership_.CheckRunning());
    // A server still registering (or moving again) answers kUnavailable: ask again.
    absl::SleepFor(absl::Milliseconds(50));
  }
}

std::future<absl::Status> Runner::Run(Tensor& t, absl::Span<const float> grad,
                                      absl::Span<float> out, bool push, bool pull,
                                      std::function<void(const absl::Status&)> on_done,
                                      bool flush, std::shared_ptr<DeviceMark> ready) {
  auto op = std::make_shared<RunOp>(&t, push, pull, out, flush);
  op->on_done = std::move(on_done);
  op->ready = std::move(ready);
  auto future = op->promise.get_future();
  if (pool_ == nullptr) {
    PrepareRun(op, grad)();
  } else if (!pool_->PostOrdered([this, op, grad] { return PrepareRun(op, grad); })) {
    Fulfil(*op, absl::FailedPreconditionError("worker stopped"));  // (on_done too)
  }
  return future;
}

JobPool::Job Runner::PrepareRun(const std::shared_ptr<RunOp>& op, absl::Span<const float> grad) {
  auto fail = [op](absl::Status s) -> JobPool::Job {
    return [op, s] { Fulfil(*op, s); };
  };
  if (auto s = membership_.CheckRunning(); !s.ok()) return fail(s);  // queued work when Stop began
  Tensor& t = *op->t;
  // A server restarted since this tensor's last operation: learn its steps first.
  if (std::vector<size_t> stale = StaleSlices(t); !stale.empty()) {
    if (auto s = ResyncWithin(t, stale, absl::Now() + options_.request_timeout); !s.ok()) {
      return fail(s);
    }
  }
  // A tensor on a device: the device's work waits for the trainer's (its gradient written).
  if (op->ready != nullptr) {
    if (auto s = t.device->WaitFor(*op->ready); !s.ok()) return fail(s);
  }
  const absl::Time started = metrics_.Now();
  {
    absl::MutexLock lock(&t.mu);
    if (op->push) {
      const IndexCoding coding =
          options_.compact_indices ? IndexCoding::kRice : IndexCoding::kPlain32;
      auto encoded = t.bucket != nullptr ? EncodeFusedPush(*t.bucket, grad, coding, op->flush)
                                         : EncodePush(t, grad, coding, op->flush);
      if (!encoded.ok()) return fail(encoded.status());
      op->encoded = *std::move(encoded);
      ++t.traffic.pushes;
    }
    if (op->pull) ++t.traffic.pulls;
    absl::MutexLock op_lock(&op->mu);
    op->Advance(RunStage::kPrepared);
  }
  return [this, op, started] {
    Tensor& t = *op->t;
    std::vector<size_t> all(t.meta.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    SendParts(op, all);
    absl::MutexLock lock(&t.mu);
    if (op->push) {
      metrics_.Pushed(t, started);
    } else {
      t.metrics.Sync(t.traffic);
    }
  };
}

void Runner::SendParts(const std::shared_ptr<RunOp>& op, const std::vector<size_t>& slices) {
  Tensor& t = *op->t;
  absl::MutexLock lock(&t.mu);
  struct Send {
    size_t slice;
    int peer = -1;
    uint64_t incarnation = 0;
    bool push = false;
  };
  std::vector<Send> sends;
  for (size_t i : slices) {
    Send& send = sends.emplace_back();
    send.slice = i;
    send.peer = links_.Peer(t.meta[i].info.server, &send.incarnation);
  }
  {
    absl::MutexLock op_lock(&op->mu);
    op->Advance(RunStage::kSent);
    for (Send& send : sends) {
      const size_t i = send.slice;
      const uint64_t incarnation = send.incarnation;
      RunOp::Part& part = op->parts[i];
      // A push the same incarnation acknowledged is not sent again (the server would only
      // acknowledge it again); one to a server that restarted since is.
      const bool pushed = part.pushed && part.sent_incarnation == incarnation;
      const uint64_t push_step = part.push_step;
      part = RunOp::Part{};
      part.push_step = push_step;
      part.pushed = pushed;
      part.sent_incarnation = incarnation;
      part.synced_incarnation = t.slices[i].incarnation;
      send.push = op->push && !pushed;
      part.in_flight = (send.push ? 1 : 0) + (op->pull ? 1 : 0);
      op->outstanding += part.in_flight;
    }
  }
  for (const Send& send : sends) {
    if (send.push) SendPush(op, send.slice, send.peer);
    if (op->pull) SendPull(op, send.slice, send.peer);
  }
}

void Runner::SendPush(const std::shared_ptr<RunOp>& op, size_t i, int peer) {
  Tensor& t = *op->t;
  const SliceMeta& m = t.meta[i];
  SliceRt& rt = t.slices[i];
  uint64_t step;
  {
    // Sent again after a restart: for the same step (the shard goes on at the workers' steps
    // and tells an applied push from a new one by it).
    absl::MutexLock op_lock(&op->mu);
    uint64_t& push_step = op->parts[i].push_step;
    if (push_step == UINT64_MAX) push_step = rt.step;
    step = push_step;
  }
  rt.step = std::max(rt.step, step + 1);
  rt.pull_floor = UINT64_MAX;
  flatbuffers::FlatBufferBuilder fbb(128);
  auto body = msg::CreatePush(
      fbb, m.key, step,
      t.bucket != nullptr ? msg::PayloadKind::Segmented
      : op->flush         ? msg::PayloadKind::Dense
                          : PayloadKindFor(CodecKind(t.spec.compression)));
  const uint64_t id = transport_.NewRequestId();
  OutMessage msg = FinishEnvelope(fbb, transport_.self(), body, id, 0, op->encoded[i]);
  t.traffic.push_wire_bytes += msg.header.size() + op->encoded[i]->size();
  t.traffic.push_dense_bytes += uint64_t{m.info.length} * sizeof(float);
  transport_.Request(peer, id, std::move(msg), absl::Now() + options_.request_timeout,
                     [this, op, i](absl::StatusOr<InMessage> reply) {
                       absl::Status st = reply.status();
                       if (!st.ok()) {
                         st = absl::Status(st.code(), absl::StrCat("push of '", op->t->spec.name,
                                                                   "': ", st.message()));
                       }
                       PartDone(op, i, /*pull_part=*/false, st);
                     });
}

void Runner::SendPull(const std::shared_ptr<RunOp>& op, size_t i, int peer) {
  Tensor& t = *op->t;
  const SliceMeta& m = t.meta[i];
  const SliceRt& rt = t.slices[i];
  uint64_t min_version = std::min(rt.step, rt.pull_floor);
  uint64_t held_push = 0;  // the step + 1 of the push this operation holds (op->encoded[i])
  if (op->push) {  // the version its push makes
    absl::MutexLock op_lock(&op->mu);
    min_version = op->parts[i].push_step + 1;
    held_push = min_version;
  }
  flatbuffers::FlatBufferBuilder fbb(128);
  auto body = msg::CreatePullRequest(fbb, m.key, min_version, rt.replica_version,
                                     WirePullFormat(t.spec.pull), held_push);
  const uint64_t id = transport_.NewRequestId();
  OutMessage msg = FinishEnvelope(fbb, transport_.self(), body, id, 0);
  const size_t request_bytes = msg.header.size();
  transport_.Request(
      peer, id, std::move(msg), absl::Now() + options_.request_timeout,
      [this, op, i, request_bytes, step = min_version](absl::StatusOr<InMessage> reply) {
        // (A stopped transport fails a request on the sending thread.)
        if (!reply.ok()) {
          return PartDone(op, i, true,
                          absl::Status(reply.status().code(),
                                       absl::StrCat("pull of '", op->t->spec.name,
                                                    "': ", reply.status().message())));
        }
        ADAPS_DCHECK_ON_IO_THREAD(&transport_);
        {
          absl::MutexLock lock(&op->mu);
          if (op->Decided()) {  // failed already: leave `out` alone
            --op->outstanding;
            return;
          }
        }
        if (reply->envelope()->body_as_PullResponse() == nullptr) {
          return PartDone(op, i, true, absl::DataLossError("pull answered with something else"));
        }
        if (pool_ == nullptr) return DecodePull(op, i, *reply, request_bytes, step);
        auto answer = std::make_shared<InMessage>(*std::move(reply));
        auto job = [this, op, i, answer, request_bytes, step] {
          DecodePull(op, i, *answer, request_bytes, step);
        };
        if (!pool_->Post(job)) job();  // stopping: decode here, as without a pool
      });
}

void Runner::DecodePull(const std::shared_ptr<RunOp>& op, size_t i, const InMessage& reply,
                        size_t request_bytes, uint64_t step) {
  {
    absl::MutexLock lock(&op->mu);
    // (A failure from now on leaves the promise to EndWrite.)
    if (!op->BeginWrite()) {  // failed meanwhile: leave `out` alone
      --op->outstanding;
      return;
    }
  }
  const msg::PullResponse* resp = reply.envelope()->body_as_PullResponse();
  // The push a forwarded answer may leave out: this operation's, for the version it made.
  const Bytes* own = op->push && resp->version() == step && i < op->encoded.size() &&
                             op->encoded[i] != nullptr
                         ? op->encoded[i].get()
                         : nullptr;
  absl::Status status = metrics_.Decode(step, [&] {
    return ApplyPull(*op->t, i, *resp, reply.payload(), reply.wire_bytes() + request_bytes,
                     op->out, own);
  });
  {
    absl::MutexLock lock(&op->mu);
    op->EndWrite();
  }
  PartDone(op, i, true, std::move(status));
}

bool Runner::Retryable(RunOp& op, size_t i, bool pull_part, const absl::Status& status) {
  const int server = op.t->meta[i].info.server;
  bool stale_step;
  {
    absl::MutexLock lock(&op.mu);
    stale_step = op.parts[i].synced_incarnation != op.parts[i].sent_incarnation;
  }
  if (!membership_.CheckRunning().ok()) return false;
  // The server went away, and can come back with its rank.
  if (status.code() == absl::StatusCode::kUnavailable) return links_.Restartable(server);
  // A recompressed pull from a replica the server's published state moved past (this worker
  // skipped pulls, joined, or retried after a restart while the others stepped on): take
  // the published replica again and ask again (Retry).
  if (pull_part && status.code() == absl::StatusCode::kAborted) return true;
  // Sent with a step learned from an earlier incarnation (the server moved between the
  // staleness check and the send): the restored shard refused the step.
  return status.code() == absl::StatusCode::kFailedPrecondition && stale_step;
}

void Runner::PartDone(const std::shared_ptr<RunOp>& op, size_t i, bool pull_part,
                      absl::Status status) {
  // On the I/O thread, or on the sending thread when the transport has stopped.
  const bool retryable = status.ok() || Retryable(*op, i, pull_part, status);
  absl::Time retry_until;
  absl::Status slice_error;
  {
    absl::MutexLock lock(&op->mu);
    RunOp::Part& part = op->parts[i];
    if (!pull_part && status.ok()) part.pushed = true;
    if (!status.ok() && part.error.ok()) part.error = status;
    if (!retryable) {
      // Fail at once (not after the other parts' deadlines), and never touch `out` again.
      op->Settle(status);
    }
    --part.in_flight;
    const bool last = --op->outstanding == 0;
    // This slice's server went away while other slices' parts are still out: it is retried
    // now, not after them. They may be waiting for it: a pull held by another server until
    // every worker pushed this step, while another worker waits (on this restarted server)
    // for the push this retry sends. The retry holds one count of `outstanding` until it
    // sent again (ReleaseHold).
    const bool early =
        !last && part.in_flight == 0 && part.error.code() == absl::StatusCode::kUnavailable;
    if (op->Decided() || (!last && !early)) return;
    if (op->retry_until == absl::InfiniteFuture()) {
      op->retry_until = absl::Now() + options_.request_timeout;
    }
    retry_until = op->retry_until;
    if (early) {
      ++op->outstanding;
      slice_error = part.error;
    }
  }
  if (!slice_error.ok()) {
    log_.get()->warn("tensor '{}': {}; retrying its slice at {} once the server is back",
                     op->t->spec.name, std::string(slice_error.message()),
                     op->t->meta[i].info.offset);
    if (!retries_.Post([this, op, i] { Retry(op, {i}, /*holds=*/true); })) {
      Fulfil(*op, slice_error);
    }
    return;
  }
  EndAttempt(op, retry_until);
}

void Runner::ReleaseHold(const std::shared_ptr<RunOp>& op) {
  absl::Time retry_until;
  {
    absl::MutexLock lock(&op->mu);
    if (--op->outstanding > 0 || op->Decided()) return;
    retry_until = op->retry_until;
  }
  EndAttempt(op, retry_until);
}

void Runner::EndAttempt(const std::shared_ptr<RunOp>& op, absl::Time retry_until) {
  // Last part of an attempt in which nothing failed for good.
  std::vector<size_t> failed;
  absl::Status first;
  {
    absl::MutexLock lock(&op->mu);
    for (size_t k = 0; k < op->parts.size(); ++k) {
      if (op->parts[k].error.ok()) continue;
      failed.push_back(k);
      if (first.ok()) first = op->parts[k].error;
    }
    if (failed.empty()) return op->Settle(absl::OkStatus());
    if (absl::Now() >= retry_until) return op->Settle(first);
    op->Advance(RunStage::kRetrying);
  }
  if (first.code() == absl::StatusCode::kAborted) {
    log_.get()->info("tensor '{}': {}; taking the published replica again", op->t->spec.name,
                     std::string(first.message()));
  } else {
    log_.get()->warn("tensor '{}': {}; retrying {} slice(s) once the server is back",
                     op->t->spec.name, std::string(first.message()), failed.size());
  }
  if (!retries_.Post([this, op, failed] { Retry(op, failed, /*holds=*/false); })) {
    Fulfil(*op, first);
  }
}

void Runner::Retry(const std::shared_ptr<RunOp>& op, std::vector<size_t> slices, bool holds) {
  absl::Status why;
  absl::Time until;
  {
    absl::MutexLock lock(&op->mu);
    why = op->parts[slices.front()].error;
    until = op->retry_until;
  }
  for (size_t i : slices) {
    RunOp::Part part;
    {
      absl::MutexLock lock(&op->mu);
      part = op->parts[i];
    }
    // A refused stale step needs no wait: the server is back already.
    if (part.error.code() != absl::StatusCode::kUnavailable) continue;
    if (!links_.WaitForNewIncarnation(op->t->meta[i].info.server, part.sent_incarnation, until)) {
      if (auto s = membership_.CheckRunning(); !s.ok()) return Fulfil(*op, s);
      return Fulfil(*op, absl::Status(why.code(),
                                      absl::StrCat(why.message(), " (the server did not come "
                                                                  "back within the request "
                                                                  "timeout)")));
    }
  }
  if (absl::Status s = ResyncWithin(*op->t, slices, until); !s.ok()) return Fulfil(*op, s);
  if (why.code() != absl::StatusCode::kAborted) {
    log_.get()->info("tensor '{}': resynchronized with the restarted server; sending again",
                     op->t->spec.name);
  }
  SendParts(op, slices);
  if (holds) ReleaseHold(op);
}

}  // namespace adaps
