// The adaps server: owns the tensor slices assigned to its rank (parameters, optimizer
// state, aggregation buffer, downlink residue) and answers pushes and pulls (DESIGN.md
// section 2).
//
// Owns one Transport: a ROUTER for workers and a DEALER to the scheduler. All slice state is
// touched only on the transport's I/O thread; the public methods are thread-safe.
//
// Sync mode: a push for step t is decoded straight into the aggregation buffer; when every
// live worker has pushed, the buffer is averaged (summed for sum-only), the optimizer runs
// once, the version becomes t+1 and held pulls are answered. Async mode: each push is
// applied on arrival. Pulls: dense float32 (encoded once per version, the same bytes for
// every worker), or recompressed (sync mode only): AdaComp over the change since the last
// published state with a server-side residue, encoded once per version, so every worker
// applying the same messages holds a bitwise-identical replica.
#ifndef ADAPS_SERVER_SERVER_H_
#define ADAPS_SERVER_SERVER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/compressor.h"
#include "common/logging.h"
#include "common/transport.h"

namespace adaps {

// kMean: the parameters become the step's averaged gradient (params := agg / pushed workers;
// async: the pushed gradient), so a pull answers exactly the mean gradient of that step.
enum class OptimizerKind { kSumOnly, kMean, kSgd, kMomentum, kNesterov, kAdam };

// "sum", "mean", "sgd", "momentum", "nesterov", "adam"; kInvalidArgument otherwise.
absl::StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

// Sets one hyper-parameter by name (learning_rate, momentum, weight_decay, beta1, beta2,
// epsilon). kInvalidArgument for an unknown name or a value out of range.
absl::Status SetHyperParam(OptimizerConfig& config, const std::string& name, double value);

// One optimizer step: params -= f(grad) (sum-only: params += grad; mean: params = grad). `m`, `v` are the
// slice's state (sized on first use); `t` the Adam step count (incremented).
void ApplyOptimizer(const OptimizerConfig& config, absl::Span<const float> grad,
                    absl::Span<float> params, std::vector<float>& m, std::vector<float>& v,
                    uint64_t& t);

struct ServerConfig {
  std::string scheduler;                     // e.g. tcp://127.0.0.1:5000
  std::string bind = "tcp://127.0.0.1:0";   // port 0: the OS picks
  std::string advertise;                     // address workers use; empty: the bound one
  std::string identity;
  bool sync = true;
  OptimizerConfig optimizer;
  absl::Duration register_timeout = absl::Seconds(60);
  // Checkpoints: Checkpoint requests, the timer, and the restore at start all use
  // `checkpoint_dir/server-<rank>.ckpt` (the one before it kept as `.ckpt.prev`). A file is
  // written to a temporary name, fsynced and renamed, and carries a CRC-32; it holds per
  // slice the parameters, optimizer state, step and downlink residue. Restored slices exist
  // from the start (workers need not declare them again).
  std::string checkpoint_dir;
  absl::Duration checkpoint_interval = absl::ZeroDuration();  // zero: no timer
  bool restore = true;
  // How long the server keeps serving without hearing from the scheduler (it re-registers
  // meanwhile when a restarted scheduler answers) before it stops with kUnavailable.
  absl::Duration scheduler_grace = absl::Seconds(60);
  // Largest slice a DeclareSlice may create (elements): memory a client can make us take.
  uint64_t max_slice_elements = uint64_t{1} << 28;
  std::string log_level = "info";
  CurveKeys curve;  // enabled: encrypted; only allowed_clients may connect (common/config.h)
};

absl::Status ValidateServerConfig(const ServerConfig& config);

class Server {
 public:
  explicit Server(ServerConfig config, std::shared_ptr<TransportContext> context = nullptr);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds, connects to the scheduler and registers; returns once the cluster view arrived.
  // kUnavailable: address in use / scheduler unreachable; kDeadlineExceeded: the cluster did
  // not form within register_timeout; kInvalidArgument: bad config.
  absl::Status Start();
  std::string endpoint() const;
  int rank() const { return transport_->rank(); }
  // Waits for the scheduler's Shutdown (or for losing the scheduler). false on timeout.
  bool WaitForShutdown(absl::Duration timeout);
  // Why the server stopped: OK for a clean Shutdown, kUnavailable when the scheduler is gone.
  absl::Status exit_status() const;
  void Stop();

 private:
  struct HeldPull {
    std::string route;
    uint64_t request_id;
    uint64_t min_version;
    uint64_t have_version;
    msg::PullFormat format;
  };
  struct Slice {
    uint64_t key = 0;
    std::string name;
    uint32_t length = 0;
    uint32_t bin_size = 0;
    std::vector<float> params, agg, m, v;
    uint64_t adam_t = 0;
    uint64_t version = 0;
    std::set<int> pushed;  // worker ranks that pushed the current step (sync)
    std::vector<HeldPull> held;
    SharedBytes dense_bytes;
    uint64_t dense_version = UINT64_MAX;
    // Downlink (recompressed pulls).
    std::vector<float> published;  // what workers hold
    std::unique_ptr<SliceState> down_residue;
    SharedBytes down_bytes;        // change from down_base to down_version
    uint64_t down_base = 0, down_version = 0;
    bool restored = false;  // parameters came from a checkpoint; ignore initial values
  };

  void Handle(InMessage in);
  void OnView(const msg::ClusterView* view);
  void OnDeclare(InMessage& in);
  void OnPush(InMessage& in);
  void OnPull(InMessage& in);
  void OnSetHyper(InMessage& in);
  void OnCheckpoint(InMessage& in);
  void Heartbeat();
  void Reregister();
  void MaybeCompleteStep(Slice& slice);
  void AnswerHeld(Slice& slice);
  absl::Status AnswerPull(Slice& slice, const HeldPull& pull);
  absl::Status WriteCheckpoint(const std::string& dir);
  // Reads dir/server-<rank>.ckpt, or server-<rank>.ckpt.prev when that is damaged, and
  // recreates the slices. OK without a checkpoint; kDataLoss when every copy is damaged.
  absl::Status ReadCheckpoint(const std::string& dir);
  absl::Status LoadCheckpointFile(const std::string& path);
  void Finish(absl::Status status);
  void ReplyError(const InMessage& in, const absl::Status& status);

  const ServerConfig config_;
  RoleLog log_;
  std::unique_ptr<Transport> transport_;

  // I/O thread only.
  OptimizerConfig optimizer_;
  std::map<uint64_t, Slice> slices_;
  std::set<int> live_workers_;
  int num_workers_ = 0;
  uint32_t epoch_ = 0;
  absl::Time last_heartbeat_ok_;
  absl::Time last_heartbeat_sent_;
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  std::unique_ptr<Compressor> down_compressor_;
  std::vector<float> scratch_;
  CompressedUpdate update_;
  absl::Time last_checkpoint_;
  uint64_t refused_ = 0;  // forged scheduler messages refused
  std::string address_;   // what we registered
  bool reregistering_ = false;

  mutable absl::Mutex mu_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status register_status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status exit_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaps

#endif  // ADAPS_SERVER_SERVER_H_
