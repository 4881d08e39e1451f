#include "server/engine.h"

#include <sched.h>

#include <algorithm>
#include <utility>

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
  writer_.Start();
}

void Engine::Stop() {
  if (!running_) return;
  running_ = false;
  for (auto& thread : threads_) thread->Close();
  for (auto& thread : threads_) thread->Join();  // they may still hand snapshots on
  writer_.Stop();
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
  writer_.SetSlices(owner_.size());
  return owner;
}

EngineThread& Engine::Thread(int index) {
  while (static_cast<int>(threads_.size()) <= index) {
    threads_.push_back(
        std::make_unique<EngineThread>(options_, sink_, &writer_, live_, optimizer_));
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
  job->hyper = writer_.hyper();
  if (!running_) {
    job->done(absl::UnavailableError("the server is stopping"), 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->remaining = static_cast<int>(threads_.size());
  }
  if (threads_.empty()) return writer_.Write(std::move(job));
  for (auto& thread : threads_) {
    EngineWork work;
    work.kind = EngineWork::Kind::kSnapshot;
    work.job = job;
    thread->Submit(std::move(work));  // running: queues are open
  }
}

}  // namespace adaps
