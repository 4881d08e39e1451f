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
}

void Engine::Stop() {
  if (!running_) return;
  running_ = false;
  for (auto& thread : threads_) thread->Close();
  for (auto& thread : threads_) thread->Join();
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
  if (options_.checkpoints != nullptr) options_.checkpoints->SetSlices(owner_.size());
  return owner;
}

EngineThread& Engine::Thread(int index) {
  while (static_cast<int>(threads_.size()) <= index) {
    threads_.push_back(
        std::make_unique<EngineThread>(options_, sink_, options_.checkpoints, live_, optimizer_));
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
  for (auto& thread : threads_) thread->Submit(LiveWorkersWork{live});
}

void Engine::SetOptimizer(const OptimizerConfig& optimizer) {
  optimizer_ = optimizer;
  for (auto& thread : threads_) thread->Submit(OptimizerWork{optimizer});
}

void Engine::Adopt(Shard shard) {
  const int owner = AssignOwner(shard.key());
  Submit(owner, AdoptWork{std::move(shard)});
}

void Engine::Snapshot(std::shared_ptr<CheckpointJob> job) {
  if (!running_ || options_.checkpoints == nullptr) {
    job->done(absl::UnavailableError(running_ ? "no checkpoint owner" : "the server is stopping"),
              0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->remaining = static_cast<int>(threads_.size());
  }
  if (threads_.empty()) return options_.checkpoints->Write(std::move(job));
  for (auto& thread : threads_) thread->Submit(SnapshotWork{job});  // running: queues are open
}

}  // namespace adaps
