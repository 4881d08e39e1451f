// One engine thread (server/engine.h): its shards, its copy of the live workers and of the
// optimizer, its queue. Everything but Submit/Close/Join runs on the thread itself.
#ifndef ADAPS_SERVER_ENGINE_THREAD_H_
#define ADAPS_SERVER_ENGINE_THREAD_H_

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <atomic>
#include <thread>

#include "absl/status/status.h"
#include "server/checkpoint_writer.h"
#include "server/engine.h"
#include "server/engine_queue.h"
#include "server/server_metrics.h"
#include "server/shard.h"

namespace adaps {

class EngineThread {
 public:
  // `live` and `optimizer`: the broadcasts so far (the thread may start late).
  // `checkpoints`: where snapshots and step records go (the engine's checkpoint owner).
  EngineThread(const EngineOptions& options, EngineSink* sink, CheckpointReports* checkpoints,
               std::set<int> live, OptimizerConfig optimizer);
  EngineThread(const EngineThread&) = delete;
  EngineThread& operator=(const EngineThread&) = delete;

  void Start();
  bool Submit(EngineWork work) { return queue_.Push(std::move(work)); }
  // Refuses further work; the thread finishes what is queued and ends.
  void Close() { queue_.Close(); }
  void Join();

 private:
  void Run();
  void Handle(EngineWork& work);
  void OnDeclare(DeclareWork& work);
  void OnDeclareBucket(DeclareWork& work);
  // The request's shard, or null once an error was answered ("<what> undeclared slice K").
  Shard* FindOrReply(const EngineRequest& work, const char* what);
  void OnPush(PushWork& work);
  void OnPull(PullWork& work);
  void OnResume(ResumeWork& work);
  void OnLiveWorkers(LiveWorkersWork& work);
  void OnSnapshot(SnapshotWork& work);
  // A step checkpoint's record of `shard` when its version is a multiple of the interval.
  void MaybeStepRecord(const Shard& shard);
  void AnswerHeld(Shard& shard);
  // Sends the shard's answer to `pull`; the shard's error is returned, not sent.
  absl::Status SendAnswer(Shard& shard, const Shard::Pull& pull);
  void Ack(const EngineRequest& work);
  void ReplyError(const EngineRequest& work, const absl::Status& status);
  // Times a request on `shard` (inert without metrics).
  ServerMetrics::Work Time(const Shard& shard, bool push);
  // Whether the caller is this engine thread (for ADAPS_DCHECK: its shards are its alone).
  // (Its id is taken by the thread itself in Run: thread_ may not be assigned yet when the
  // thread starts working.)
  bool OnThread() const { return std::this_thread::get_id() == thread_id_.load(); }

  const EngineOptions& options_;
  EngineSink* const sink_;
  CheckpointReports* const checkpoints_;
  ClosableQueue<EngineWork> queue_;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};

  // The thread's own state (touched only by the thread after Start).
  std::map<uint64_t, Shard> shards_;
  std::set<int> live_;
  OptimizerConfig optimizer_;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_ENGINE_THREAD_H_
