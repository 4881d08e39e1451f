#include "server/engine.h"

#include <sched.h>

#include <algorithm>
#include <utility>

#include "server/checkpoint.h"
#include "server/engine_thread.h"

namespace adaps {

int DefaultEngineThreads(int requested) {
  if (requested > 0) return requested;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

Engine::Engine(EngineOptions options, EngineSink* sink)
    : options_(std::move(options)), sink_(sink), optimizer_(options_.optimizer) {}

Engine::~Engine() { Stop(); }

void Engine::Start() {
  if (running_) return;
  running_ = true;
  writer_ = std::thread([this] { RunWriter(); });
}

void Engine::Stop() {
  if (!running_) return;
  running_ = false;
  for (auto& thread : threads_) thread->Close();
  for (auto& thread : threads_) thread->Join();  // they may still hand snapshots on
  writes_.Close();
  if (writer_.joinable()) writer_.join();
}

int Engine::OwnerOf(uint64_t key) const {
  auto it = owner_.find(key);
  return it == owner_.end() ? -1 : it->second;
}

int Engine::AssignOwner(uint64_t key) {
  auto it = owner_.find(key);
  if (it != owner_.end()) return it->second;
  const int owner = next_owner_;
  next_owner_ = (next_owner_ + 1) % std::max(1, options_.threads);
  owner_.emplace(key, owner);
  slices_ = owner_.size();
  return owner;
}

EngineThread& Engine::Thread(int index) {
  while (static_cast<int>(threads_.size()) <= index) {
    threads_.push_back(
        std::make_unique<EngineThread>(options_, sink_, this, live_, optimizer_));
    threads_.back()->Start();
  }
  return *threads_[index];
}

bool Engine::Submit(int owner, EngineWork work) {
  if (!running_ || owner < 0 || owner >= std::max(1, options_.threads)) return false;
  return Thread(owner).Submit(std::move(work));
}

void Engine::SetLiveWorkers(const std::set<int>& live) {
  if (live == live_) return;
  live_ = live;
  for (auto& thread : threads_) {
    EngineWork work;
    work.kind = EngineWork::Kind::kLiveWorkers;
    work.live = live;
    thread->Submit(std::move(work));
  }
}

void Engine::SetOptimizer(const OptimizerConfig& optimizer) {
  optimizer_ = optimizer;
  for (auto& thread : threads_) {
    EngineWork work;
    work.kind = EngineWork::Kind::kOptimizer;
    work.optimizer = optimizer;
    thread->Submit(std::move(work));
  }
}

void Engine::Adopt(Shard shard) {
  EngineWork work;
  work.kind = EngineWork::Kind::kAdopt;
  work.key = shard.key();
  const int owner = AssignOwner(work.key);
  work.shard.emplace(std::move(shard));
  Submit(owner, std::move(work));
}

void Engine::Checkpoint(std::string path, std::string job_id,
                        std::function<void(absl::Status, size_t)> done) {
  auto job = std::make_shared<CheckpointJob>();
  job->path = std::move(path);
  job->job_id = std::move(job_id);
  job->done = std::move(done);
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    job->hyper = hyper_;
  }
  if (!running_) {
    job->done(absl::UnavailableError("the server is stopping"), 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->remaining = static_cast<int>(threads_.size());
  }
  if (threads_.empty()) return HandToWriter(std::move(job));
  for (auto& thread : threads_) {
    EngineWork work;
    work.kind = EngineWork::Kind::kSnapshot;
    work.job = job;
    thread->Submit(std::move(work));  // running: queues are open
  }
}

void Engine::SetStepCheckpoints(std::function<std::string(uint64_t)> path, std::string job_id,
                                std::function<void(uint64_t, absl::Status, size_t)> done) {
  std::lock_guard<std::mutex> lock(step_mu_);
  step_path_ = std::move(path);
  step_job_id_ = std::move(job_id);
  step_done_ = std::move(done);
}

void Engine::SetCheckpointHyper(HyperValues hyper) {
  std::lock_guard<std::mutex> lock(step_mu_);
  hyper_ = std::move(hyper);
}

void Engine::AddStepRecord(uint64_t step, SliceRecord record) {
  auto job = std::make_shared<CheckpointJob>();
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    if (!step_path_) return;
    std::vector<SliceRecord>& records = step_records_[step];
    records.push_back(std::move(record));
    if (records.size() + unheld_.size() < slices_.load()) return;
    job->records = std::move(records);
    // Older steps some slice never reached (e.g. it moved on past them) are given up.
    step_records_.erase(step_records_.begin(), step_records_.upper_bound(step));
    job->path = step_path_(step);
    job->job_id = step_job_id_;
    job->hyper = hyper_;
    job->done = [done = step_done_, step](absl::Status st, size_t n) { done(step, std::move(st), n); };
  }
  HandToWriter(std::move(job));
}

void Engine::SetShardHeld(uint64_t key, bool held) {
  std::lock_guard<std::mutex> lock(step_mu_);
  if (held) {
    unheld_.erase(key);
  } else {
    unheld_.insert(key);
  }
}

void Engine::HandToWriter(std::shared_ptr<CheckpointJob> job) {
  if (!writes_.Push(job)) job->done(absl::UnavailableError("the server is stopping"), 0);
}

void Engine::RunWriter() {
  std::deque<std::shared_ptr<CheckpointJob>> batch;
  while (writes_.PopAll(batch)) {
    for (auto& job : batch) {
      std::vector<SliceRecord> records;
      {
        std::lock_guard<std::mutex> lock(job->mu);
        records = std::move(job->records);
      }
      // Key order, as one thread wrote them: the same state gives the same file.
      std::sort(records.begin(), records.end(),
                [](const SliceRecord& a, const SliceRecord& b) { return a.key < b.key; });
      absl::Status status = WriteCheckpointFile(job->path, records, job->job_id, job->hyper);
      job->done(std::move(status), records.size());
    }
    batch.clear();
  }
}

}  // namespace adaps
