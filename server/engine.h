// The server's engine: the threads that own the slices (DESIGN.md section 2, issue 12).
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
// last one hands the records to the checkpoint owner (server/checkpoint_writer.h, through
// its narrow CheckpointReports interface), whose thread writes the file and then calls the
// request's callback: the I/O thread never waits.
//
// Threads: engine threads are started as slices arrive (never more than slices, nor than
// EngineOptions::threads), the writer at Start. Stop closes every queue, lets the threads
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
#include <vector>

#include "absl/status/status.h"
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

// One unit of work for an engine thread. The I/O thread fills what the owner needs from the
// envelope (the owner never reads the envelope: it may not survive the move), and moves the
// received message in `frame` so that its payload stays alive; tests and benchmarks give
// `bytes` instead.
struct EngineWork {
  enum class Kind { kDeclare, kPush, kPull, kLiveWorkers, kOptimizer, kSnapshot, kAdopt };
  Kind kind = Kind::kPush;
  uint64_t key = 0;
  // Where the answer goes: a ROUTER route, or a DEALER peer when peer >= 0.
  std::string route;
  int peer = -1;
  uint64_t request_id = 0;
  // kPush (kPull: the puller's rank, and the step + 1 of the push it holds, or 0)
  int worker = -1;
  uint64_t step = 0;
  // kPull
  uint64_t min_version = 0;
  uint64_t have_version = 0;
  Shard::Format format = Shard::Format::kDense;
  // kDeclare
  std::string name;
  uint32_t length = 0;
  uint32_t bin_size = 0;
  bool has_init = false;
  std::vector<WireSegment> segments;  // a fusion bucket's table (DeclareSlice.segments)
  uint32_t downlink_bin_cap = 0;        // a bucket's: the server's --pull_bin_size (0: none)
  // The payload (push, declare's initial values): bytes when set, else frame's payload.
  InMessage frame;
  SharedBytes bytes;
  // Broadcasts and hand-overs.
  std::set<int> live;
  OptimizerConfig optimizer;
  std::shared_ptr<struct CheckpointJob> job;
  std::optional<Shard> shard;

  absl::Span<const uint8_t> payload() const {
    return bytes ? absl::MakeConstSpan(*bytes) : frame.payload();
  }
};

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
  // reaches a multiple of this (0: never); see Engine::SetStepCheckpoints.
  uint64_t checkpoint_every_steps = 0;
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
  // Snapshots every shard and writes `path` off this thread; `done` gets the outcome.
  void Checkpoint(std::string path, std::string job_id,
                  std::function<void(absl::Status, size_t)> done);

  int threads_running() const { return static_cast<int>(threads_.size()); }

  // The checkpoint owner: step checkpoints' destination, the hyperparameters every
  // checkpoint carries (server/checkpoint_writer.h).
  CheckpointWriter& checkpoints() { return writer_; }

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
  // Started in Start, stopped after the engine threads in Stop (they may still hand
  // snapshots on).
  CheckpointWriter writer_;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_ENGINE_H_
