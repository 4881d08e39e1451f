// The server's engine: the threads that own the slices (docs/architecture.md, "The path
// of one gradient").
//
// Each engine thread owns some shards (server/shard.h) and is the only thread that touches
// them: decode-add of pushes, the optimizer, dense publishing and recompression all run
// there, so nothing is locked on the hot path. The server's I/O thread is the one producer:
// it checks what needs no slice state, picks the owner of the slice (round-robin when a
// slice is first declared or restored) and moves the message into the owner's closable
// queue (the received frames travel with it: zero-copy). Owners answer through an
// EngineSink (the server's: Transport::Send/SendRoute, which are thread-safe).
//
// Order: every queue sees the I/O thread's messages in the order they arrived, and the
// broadcasts (live workers, optimizer, checkpoint snapshots) are queued to every thread at
// one point of that order: a SetHyper acked before a push applies to that push's step, a
// checkpoint holds exactly the messages routed before its request.
//
// Checkpoints: each thread snapshots its shards' records when the snapshot reaches it; the
// last one hands the records to the checkpoint owner (server/checkpoint_policy.h, through
// the narrow CheckpointReports interface of server/checkpoint_writer.h), whose thread writes
// the file and then calls the request's callback: the I/O thread never waits. The engine
// holds no checkpoint state of its own.
//
// Threads: engine threads are started as slices arrive (never more than slices, nor than
// EngineOptions::threads). Stop closes every queue, lets the threads
// finish what is queued (answers then go to the sink, which may drop them), and joins.
// Thread-safety: Start/Stop from the owner (Server), after the producer stopped; every other
// method from the one producer thread (the I/O thread).
#ifndef ADAPS_SERVER_ENGINE_H_
#define ADAPS_SERVER_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "common/logging.h"
#include "common/messages.h"
#include "common/optimizer.h"
#include "common/transport.h"
#include "server/checkpoint_writer.h"
#include "server/engine_queue.h"
#include "server/shard.h"

namespace adaps {

class ServerMetrics;

// The engine threads the process may use: the cores of its affinity mask
// (sched_getaffinity), at least 1. `requested` > 0 is taken as it is.
int DefaultEngineThreads(int requested = 0);

// What an engine thread is given: a worker's request (declare, push, pull) or one of the
// I/O thread's broadcasts and hand-overs, as one std::variant (EngineWork).
//
// A request carries what the owner needs from the envelope (the owner never reads the
// envelope: it may not survive the move), and the received message in `frame` so that its
// payload stays alive; tests and benchmarks give `bytes` instead.
struct EngineRequest {
  uint64_t key = 0;
  // Where the answer goes: a ROUTER route, or a DEALER peer when peer >= 0.
  std::string route;
  int peer = -1;
  uint64_t request_id = 0;
  // The payload (push, declare's initial values): bytes when set, else frame's payload.
  InMessage frame;
  SharedBytes bytes;

  absl::Span<const uint8_t> payload() const {
    return bytes ? absl::MakeConstSpan(*bytes) : frame.payload();
  }
};

struct DeclareWork : EngineRequest {
  std::string name;
  uint32_t length = 0;
  uint32_t bin_size = 0;
  bool has_init = false;
  std::vector<WireSegment> segments;  // a fusion bucket's table (DeclareSlice.segments)
  uint32_t downlink_bin_cap = 0;      // a bucket's: the server's --pull_bin_size (0: none)
  bool sparse_pulls = false;          // declared with pull_format = Sparse (Shard::TrackSteps)
  // Declared with pull_format = Recompressed on servers running `mean` (Shard::
  // set_running_mean: the slice accumulates the steps' means), and the declaration's
  // DeclareSlice.pull_bin_divisor.
  bool recompressed_pulls = false;
  uint32_t pull_bin_divisor = 1;
  // DeclareSlice.keep_sum on servers running `mean`, pulls Dense or Sparse (Shard::
  // KeepSum: the running sum beside the step's mean, for a worker that joins).
  bool keep_sum = false;
};

struct PushWork : EngineRequest {
  int worker = -1;
  uint64_t step = 0;
  // The payload parsed where it arrived (Server::OnPush: ParseUpdate), not read again; the
  // engine thread re-points it at payload() (ParsedUpdate::MoveTo) before use.
  ParsedUpdate push;
};

struct PullWork : EngineRequest {
  int worker = -1;         // the puller's rank
  uint64_t held_push = 0;  // the step + 1 of this slice's push the puller holds; 0: none
  uint64_t min_version = 0;
  uint64_t have_version = 0;
  uint64_t offset = 0;  // Dense and Replica: the answer's first element
  Shard::Format format = Shard::Format::kDense;
};

// A worker saw `seen_version` of the slice before its server restarted (msg::Resume).
struct ResumeWork : EngineRequest {
  int worker = -1;
  uint64_t seen_version = 0;
};

// Broadcasts (queued to every thread at one point of the I/O thread's order) and hand-overs.
struct LiveWorkersWork {
  std::set<int> live;
};
struct OptimizerWork {
  OptimizerConfig optimizer;
};
struct SnapshotWork {
  std::shared_ptr<struct CheckpointJob> job;
};
struct AdoptWork {
  Shard shard;
};

using EngineWork = std::variant<DeclareWork, PushWork, PullWork, ResumeWork, LiveWorkersWork,
                                OptimizerWork, SnapshotWork, AdoptWork>;

// The request part of `work`; null for a broadcast or hand-over.
inline EngineRequest* AsRequest(EngineWork& work) {
  return std::visit(
      [](auto& w) -> EngineRequest* {
        if constexpr (std::is_base_of_v<EngineRequest, std::decay_t<decltype(w)>>) {
          return &w;
        } else {
          return nullptr;
        }
      },
      work);
}

// Where engine threads send answers. Called from any engine thread: must be thread-safe.
class EngineSink {
 public:
  virtual ~EngineSink() = default;
  virtual void Send(const std::string& route, int peer, OutMessage message) = 0;
  virtual Sender self() const = 0;
};

struct EngineOptions {
  int threads = 1;  // the most engine threads (>= 1; see DefaultEngineThreads)
  bool sync = true;
  OptimizerConfig optimizer;
  uint64_t max_slice_elements = uint64_t{1} << 28;
  // Sync: a step completes once all but this many live workers pushed (ServerConfig).
  int backup_workers = 0;
  // Per-slice series (server/server_metrics.h; thread-safe); null: none. Must outlive the
  // engine.
  ServerMetrics* metrics = nullptr;
  // Step checkpoints (server/checkpoint.h): every slice is recorded when its version
  // reaches a multiple of this (0: never).
  uint64_t checkpoint_every_steps = 0;
  // The checkpoint owner (server/checkpoint_policy.h) the threads report snapshots, step
  // records and shard holdings to; must outlive the engine. Null: no checkpoints (a snapshot
  // fails at once; benchmarks).
  CheckpointReports* checkpoints = nullptr;
  // Where engine threads log (the server's; thread-safe); null: they do not.
  const RoleLog* log = nullptr;
};

class EngineThread;

class Engine {
 public:
  Engine(EngineOptions options, EngineSink* sink);
  ~Engine();  // Stop()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void Start();
  // Closes the queues, lets every thread finish what is queued, joins them and the writer.
  void Stop();

  // The thread that owns `key`, or -1 when the key was never assigned.
  int OwnerOf(uint64_t key) const;
  // The owner of `key`, assigning the next thread (round-robin) to a new key.
  int AssignOwner(uint64_t key);
  // Moves `work` to thread `owner`'s queue. false when the engine is stopped.
  bool Submit(int owner, EngineWork work);
  // Broadcasts (queued to every running thread; a thread started later starts with them).
  void SetLiveWorkers(const std::set<int>& live);
  void SetOptimizer(const OptimizerConfig& optimizer);
  // Hands a (restored) shard to its owner, assigning one.
  void Adopt(Shard shard);
  // Every thread adds its shards' records to `job` when the snapshot reaches it (after
  // every message routed before); the last hands it to the checkpoint owner to write. A
  // stopped engine fails the job at once.
  void Snapshot(std::shared_ptr<CheckpointJob> job);

  int threads_running() const { return static_cast<int>(threads_.size()); }

 private:
  EngineThread& Thread(int index);  // starts threads up to `index`

  const EngineOptions options_;
  EngineSink* const sink_;
  // Producer (I/O thread) state.
  std::map<uint64_t, int> owner_;
  int next_owner_ = 0;
  std::set<int> live_;
  OptimizerConfig optimizer_;
  bool running_ = false;
  std::vector<std::unique_ptr<EngineThread>> threads_;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_ENGINE_H_
