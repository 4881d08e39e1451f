// An in-process stand-in for a parameter server and W synchronous data-parallel workers,
// for accuracy studies without processes or sockets.
//
// Every worker has its own GradientExchange endpoint, its own residue per tensor and its
// own compressors. At each step a worker compresses each gradient tensor, encodes it with
// the wire codec (the bytes a push would carry), and waits at a barrier; the last worker
// to arrive decodes all W pushes in worker order (so the result does not depend on thread
// timing), averages them, applies SGD with momentum to the server's copy of the
// parameters (common/optimizer.h), and releases everyone; each worker then copies the new parameters (a dense
// pull) into its tensors.
//
// Traffic is counted per layer type: the bytes each push carries (encoded update plus
// `message_header_bytes` per tensor message, an estimate of the ZeroMQ framing and
// FlatBuffers push header the cluster adds around the payload), and what the same push
// would cost dense (a dense-encoded update plus the same header).
//
// Ownership: the cluster owns the endpoints and the server state; endpoints live as long
// as the cluster. Thread-safety: each endpoint is used by one thread; the endpoints of
// one cluster may (and, for W > 1, must) be driven from W threads at once. `traffic()`
// and `server_params()` may be read while no exchange is in flight.
#ifndef ADAPS_WORKER_APP_TRAINER_SIMULATED_CLUSTER_H_
#define ADAPS_WORKER_APP_TRAINER_SIMULATED_CLUSTER_H_

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/optimizer.h"
#include "common/wire_codec.h"
#include "worker/app/trainer/exchange.h"

namespace adaps::trainer {

// Estimated bytes around each tensor push besides the encoded update: two ZeroMQ frame
// headers (2 x 2 bytes), and a FlatBuffers Push table (root offset 4, vtable 4 + 2 x 6
// fields, key u64, step u64, worker rank u32, slice offset u32, payload vector length u32,
// alignment) of about 44 bytes. Rounded to 48.
inline constexpr size_t kMessageHeaderBytes = 48;

struct SimulationOptions {
  int workers = 4;
  CompressionConfig compression;
  float learning_rate = 0.05f;
  float momentum = 0.9f;
  // The workers' momentum correction (adaps-worker --local_momentum, DGC): each worker pushes
  // its velocity u = local_momentum * u + g, compressed with error feedback; 0: the gradient.
  float local_momentum = 0.0f;
  // When > 0, the learning rate follows a cosine from learning_rate at step 0 down to 0 at
  // step decay_steps (and stays 0 after); otherwise it is constant.
  int64_t decay_steps = 0;
  IndexCoding coding = IndexCoding::kRice;
  size_t message_header_bytes = kMessageHeaderBytes;
  // How long a worker waits at the barrier for the others before giving up.
  absl::Duration barrier_timeout = absl::Minutes(10);
};

// The simulated traffic of one layer kind (not adaps::TrafficCounters, a real worker's per tensor).
struct KindTraffic {
  uint64_t messages = 0;
  uint64_t elements = 0;       // tensor elements pushed (dense count)
  uint64_t sent_elements = 0;  // elements that carried information
  uint64_t payload_bytes = 0;  // encoded updates only
  uint64_t sent_bytes = 0;     // encoded updates plus message headers
  uint64_t dense_bytes = 0;    // dense-encoded updates plus message headers
  double rate() const { return sent_bytes ? static_cast<double>(dense_bytes) / sent_bytes : 0.0; }
};

struct TrafficStats {
  std::array<KindTraffic, 3> by_kind;  // indexed by LayerKind
  uint64_t pulled_bytes = 0;               // dense pulls, headers included
  KindTraffic Total() const;
};

class SimulatedCluster {
 public:
  // `initial` gives the names, kinds, shapes and starting values of the parameters (every
  // worker's model must start from the same values). kInvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<SimulatedCluster>> Create(
      const SimulationOptions& options, const std::vector<ParamTensor>& initial);
  ~SimulatedCluster();

  int workers() const { return options_.workers; }
  // The endpoint of worker `w` in [0, workers()).
  GradientExchange* endpoint(int w);
  // Counters so far (all workers together).
  TrafficStats traffic() const;
  const std::vector<ParamTensor>& server_params() const { return server_; }
  // The compressor options each tensor is pushed with, in parameter order.
  const std::vector<CompressorOptions>& tensor_options() const { return tensor_options_; }

 private:
  class Endpoint;
  explicit SimulatedCluster(const SimulationOptions& options);
  // Called by endpoint `w` after it stored its encoded pushes for `step`.
  absl::Status Arrive(int w, int64_t step, const std::vector<KindTraffic>& counted,
                      std::vector<ParamTensor>& params);
  absl::Status AggregateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SimulationOptions options_;
  std::vector<CompressorOptions> tensor_options_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  // pushes_[w][i]: worker w's encoded update of tensor i for the current step.
  std::vector<std::vector<std::vector<uint8_t>>> pushes_;
  std::vector<ParamTensor> server_;  // values only; grad holds the averaged update
  std::vector<OptimizerState> optimizer_state_;
  std::vector<size_t> dense_message_bytes_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  TrafficStats traffic_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaps::trainer

#endif  // ADAPS_WORKER_APP_TRAINER_SIMULATED_CLUSTER_H_
