#include "server/engine_thread.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/transport.h"
#include "server/server_metrics.h"

namespace adaps {

EngineThread::EngineThread(const EngineOptions& options, EngineSink* sink,
                           CheckpointReports* checkpoints, std::set<int> live,
                           OptimizerConfig optimizer)
    : options_(options),
      sink_(sink),
      checkpoints_(checkpoints),
      live_(std::move(live)),
      optimizer_(optimizer) {}

void EngineThread::Start() { thread_ = std::thread([this] { Run(); }); }

void EngineThread::Join() {
  if (thread_.joinable()) thread_.join();
}

void EngineThread::Run() {
  thread_id_.store(std::this_thread::get_id());
  std::deque<EngineWork> batch;
  while (queue_.PopAll(batch)) {
    for (EngineWork& work : batch) Handle(work);
    batch.clear();  // frees the frames now, not at the next wake-up
  }
}

void EngineThread::Handle(EngineWork& work) {
  ADAPS_DCHECK(OnThread(), "an engine thread's shards are touched only on it");
  struct Visitor {
    EngineThread& t;
    void operator()(DeclareWork& w) {
      t.OnDeclare(w);
      // A refused declaration of a new key leaves no shard: the step records must not wait
      // for one (the key keeps its owner, which refuses its pushes as undeclared).
      if (t.checkpoints_ != nullptr) {
        t.checkpoints_->SetShardHeld(w.key, t.shards_.count(w.key) > 0);
      }
    }
    void operator()(PushWork& w) { t.OnPush(w); }
    void operator()(PullWork& w) { t.OnPull(w); }
    void operator()(ResumeWork& w) { t.OnResume(w); }
    void operator()(LiveWorkersWork& w) { t.OnLiveWorkers(w); }
    void operator()(OptimizerWork& w) { t.optimizer_ = w.optimizer; }
    void operator()(SnapshotWork& w) { t.OnSnapshot(w); }
    void operator()(AdoptWork& w) { t.shards_.emplace(w.shard.key(), std::move(w.shard)); }
  };
  std::visit(Visitor{*this}, work);
}

void EngineThread::Ack(const EngineRequest& work) {
  sink_->Send(work.route, work.peer, MakeAck(sink_->self(), work.request_id));
}

ServerMetrics::Work EngineThread::Time(const Shard& shard, bool push) {
  if (options_.metrics == nullptr) return ServerMetrics::Work();
  return options_.metrics->Time(shard, push ? ServerMetrics::Op::kPush : ServerMetrics::Op::kPull);
}

void EngineThread::ReplyError(const EngineRequest& work, const absl::Status& status) {
  if (options_.metrics != nullptr) options_.metrics->Rejected(status);
  if (work.request_id == 0) return;
  sink_->Send(work.route, work.peer, MakeError(sink_->self(), work.request_id, status));
}

// A fusion bucket's declaration (shard.h: DeclareSegments); `length` is its capacity.
void EngineThread::OnDeclareBucket(DeclareWork& work) {
  ADAPS_DCHECK(OnThread(), "an engine thread's shards are touched only on it");
  auto it = shards_.find(work.key);
  uint64_t total = 0;
  for (const WireSegment& seg : work.segments) total += seg.length;
  if (total > work.length) {
    return ReplyError(work, absl::InvalidArgumentError(absl::StrCat(
                                "bucket segments hold ", total, " elements, more than its ",
                                work.length)));
  }
  const WireSegment last = work.segments.back();
  if (work.has_init) {
    if (auto st = Shard::CheckInitialValues(last.length, work.payload()); !st.ok()) {
      return ReplyError(work, st);
    }
  }
  if (it == shards_.end()) {
    auto shard = Shard::CreateBucket(work.key, work.name, work.segments);
    if (!shard.ok()) return ReplyError(work, shard.status());
    it = shards_.emplace(work.key, *std::move(shard)).first;
  }
  const absl::Span<const uint8_t> init =
      work.has_init ? work.payload() : absl::Span<const uint8_t>();
  if (auto st = it->second.DeclareSegments(work.segments, init); !st.ok()) {
    return ReplyError(work, st);
  }
  it->second.set_downlink_bin_cap(work.downlink_bin_cap);
  it->second.set_downlink_bin_divisor(work.pull_bin_divisor);
  if (work.sparse_pulls) it->second.TrackSteps();
  if (work.recompressed_pulls) it->second.set_running_mean();
  if (work.keep_sum) it->second.KeepSum();
  Ack(work);
}

void EngineThread::OnDeclare(DeclareWork& work) {
  ADAPS_DCHECK(OnThread(), "an engine thread's shards are touched only on it");
  if (!work.segments.empty()) return OnDeclareBucket(work);
  auto it = shards_.find(work.key);
  // The server checks this too, but only for a key with no owner yet: a re-declaration after
  // this thread refused the first one (no shard here, an owner there) is checked only here.
  if (work.length > options_.max_slice_elements && it == shards_.end()) {
    return ReplyError(work, absl::ResourceExhaustedError(absl::StrCat(
                                "slice of ", work.length, " elements exceeds --max_slice_elements ",
                                options_.max_slice_elements)));
  }
  if (work.has_init) {
    if (auto st = Shard::CheckInitialValues(work.length, work.payload()); !st.ok()) {
      return ReplyError(work, st);
    }
  }
  if (it == shards_.end()) {
    auto shard = Shard::Create(work.key, work.name, work.length, work.bin_size);
    if (!shard.ok()) return ReplyError(work, shard.status());
    it = shards_.emplace(work.key, *std::move(shard)).first;
  } else if (it->second.length() != work.length || it->second.bin_size() != work.bin_size) {
    return ReplyError(work, absl::InvalidArgumentError(absl::StrCat(
                                "slice ", work.key, " exists with length ", it->second.length(),
                                " and bin size ", it->second.bin_size())));
  }
  if (work.has_init) it->second.Initialize(work.payload());
  if (work.sparse_pulls) it->second.TrackSteps();
  if (work.recompressed_pulls) it->second.set_running_mean();
  if (work.keep_sum) it->second.KeepSum();
  Ack(work);
}

Shard* EngineThread::FindOrReply(const EngineRequest& work, const char* what) {
  ADAPS_DCHECK(OnThread(), "an engine thread's shards are touched only on it");
  auto it = shards_.find(work.key);
  if (it == shards_.end()) {
    ReplyError(work, absl::InvalidArgumentError(
                         absl::StrCat(what, " undeclared slice ", work.key)));
    return nullptr;
  }
  return &it->second;
}

void EngineThread::OnPush(PushWork& work) {
  Shard* found = FindOrReply(work, "push to");
  if (found == nullptr) return;
  Shard& shard = *found;
  ServerMetrics::Work timing = Time(shard, /*push=*/true);
  const absl::Time start = absl::Now();
  work.push.MoveTo(work.payload());
  if (options_.sync) {
    const uint64_t version = shard.version();
    // SGD that a sparse step allows: a tracked step's pushes are kept and stepped one by
    // one at its end (Shard::AddPush).
    const bool each_push =
        optimizer_.kind == OptimizerKind::kSgd && SparseStepAllowed(optimizer_).ok();
    if (auto st = shard.AddPush(work.worker, work.step, work.push, options_.backup_workers,
                                each_push);
        !st.ok()) {
      // A push sent again (its answer was lost with a connection): applied once already.
      if (st.code() == absl::StatusCode::kAlreadyExists) return Ack(work);
      return ReplyError(work, st);
    }
    if (options_.metrics != nullptr) options_.metrics->Pushed(shard, work.frame.wire_bytes());
    Ack(work);
    // (A restored shard may have moved to the workers' step: pulls held for it are ready.)
    const bool completed = shard.CompleteStepIfReady(live_, optimizer_, options_.backup_workers);
    shard.CountStepWork(absl::Now() - start, completed);
    if (completed || shard.version() != version) AnswerHeld(shard);
    if (completed) MaybeStepRecord(shard);
    return;
  }
  if (auto st = shard.ApplyPush(work.push, optimizer_); !st.ok()) {
    return ReplyError(work, st);
  }
  shard.CountStepWork(absl::Now() - start, /*completed=*/true);
  if (options_.metrics != nullptr) options_.metrics->Pushed(shard, work.frame.wire_bytes());
  Ack(work);
  AnswerHeld(shard);
}

void EngineThread::OnPull(PullWork& work) {
  Shard* found = FindOrReply(work, "pull of");
  if (found == nullptr) return;
  Shard& shard = *found;
  // A worker never waits for more than the step after the current one (its push for this
  // step is in); anything further would be held forever, so a client could pile them up.
  if (options_.sync && work.min_version > shard.version() + 1) {
    return ReplyError(work, absl::FailedPreconditionError(absl::StrCat(
                                "pull for version ", work.min_version, " but slice '",
                                shard.name(), "' is at ", shard.version())));
  }
  ServerMetrics::Work timing = Time(shard, /*push=*/false);
  if (options_.metrics != nullptr) options_.metrics->PullRequested(shard, work.frame.wire_bytes());
  Shard::Pull pull{std::move(work.route), work.request_id,
                   options_.sync ? work.min_version : 0, work.have_version, work.format};
  pull.peer = work.peer;
  pull.worker = work.worker;
  pull.held_push = work.held_push;
  pull.offset = work.offset;
  if (pull.min_version > shard.version()) {
    shard.Hold(std::move(pull));
    return;
  }
  if (auto st = SendAnswer(shard, pull); !st.ok()) {
    sink_->Send(pull.route, pull.peer, MakeError(sink_->self(), pull.request_id, st));
  }
}

void EngineThread::OnResume(ResumeWork& work) {
  Shard* found = FindOrReply(work, "resume of");
  if (found == nullptr) return;
  Shard& shard = *found;
  const uint64_t was = shard.version();
  if (options_.sync && shard.ResumeAt(work.seen_version)) {
    if (options_.log != nullptr) {
      options_.log->get()->info(
          "slice '{}' goes on at step {}, not at the restored {}: worker {} saw it before the "
          "restart",
          shard.name(), shard.version(), was, work.worker);
    }
    AnswerHeld(shard);
  }
  Ack(work);
}

void EngineThread::OnLiveWorkers(LiveWorkersWork& work) {
  ADAPS_DCHECK(OnThread(), "an engine thread's shards are touched only on it");
  live_ = std::move(work.live);
  if (!options_.sync) return;
  // Sync: every step the lost workers were holding up completes now.
  for (auto& [key, shard] : shards_) {
    ServerMetrics::Work timing = Time(shard, /*push=*/true);
    const absl::Time start = absl::Now();
    const bool completed = shard.CompleteStepIfReady(live_, optimizer_, options_.backup_workers);
    shard.CountStepWork(absl::Now() - start, completed);
    if (completed) {
      AnswerHeld(shard);
      MaybeStepRecord(shard);
    }
  }
}

void EngineThread::MaybeStepRecord(const Shard& shard) {
  const uint64_t every = options_.checkpoint_every_steps;
  if (every > 0 && shard.version() % every == 0 && checkpoints_ != nullptr) {
    checkpoints_->AddStepRecord(shard.version(), shard.ToRecord());
  }
}

void EngineThread::OnSnapshot(SnapshotWork& work) {
  ADAPS_DCHECK(OnThread(), "an engine thread's shards are touched only on it");
  std::shared_ptr<CheckpointJob> job = std::move(work.job);
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    for (const auto& [key, shard] : shards_) job->records.push_back(shard.ToRecord());
    last = --job->remaining == 0;
  }
  if (last) checkpoints_->Write(std::move(job));
}

void EngineThread::AnswerHeld(Shard& shard) {
  ADAPS_DCHECK(OnThread(), "an engine thread's shards are touched only on it");
  for (const Shard::Pull& pull : shard.TakeReadyPulls()) {
    if (auto st = SendAnswer(shard, pull); !st.ok()) {
      sink_->Send(pull.route, pull.peer, MakeError(sink_->self(), pull.request_id, st));
    }
  }
}

absl::Status EngineThread::SendAnswer(Shard& shard, const Shard::Pull& pull) {
  ADAPS_DCHECK(OnThread(), "an engine thread's shards are touched only on it");
  const absl::Time start = absl::Now();
  ADAPS_ASSIGN_OR_RETURN(Shard::Answer answer, shard.AnswerPull(pull));
  shard.CountPublishWork(absl::Now() - start);
  msg::PullFormat format = msg::PullFormat::Dense;
  switch (answer.format) {
    case Shard::Format::kDense: format = msg::PullFormat::Dense; break;
    case Shard::Format::kRecompressed: format = msg::PullFormat::Recompressed; break;
    case Shard::Format::kReplica: format = msg::PullFormat::Replica; break;
    case Shard::Format::kSparse: format = msg::PullFormat::Sparse; break;
    case Shard::Format::kForwarded: format = msg::PullFormat::Forwarded; break;
  }
  flatbuffers::FlatBufferBuilder fbb(128);
  auto body = msg::CreatePullResponse(fbb, shard.key(), answer.version, answer.base, format,
                                      shard.version_work_us(), answer.zero_base,
                                      answer.offset);
  OutMessage out =
      FinishEnvelope(fbb, sink_->self(), body, 0, pull.request_id, std::move(answer.payload));
  if (options_.metrics != nullptr) {
    options_.metrics->PullAnswered(shard, answer.format,
                                   out.header.size() + (out.payload ? out.payload->size() : 0));
  }
  sink_->Send(pull.route, pull.peer, std::move(out));
  return absl::OkStatus();
}

}  // namespace adaps
