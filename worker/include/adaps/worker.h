// adaps::Worker: the client side of the adaps parameter server, linked into a trainer.
//
// A Worker registers with the scheduler, learns its rank and the servers, and then pushes
// compressed gradients and pulls parameters for the tensors it declared. It keeps one
// compression residue per tensor slice (the error feedback of AdaComp, Top-k and sign).
//
// Ownership: the caller owns every buffer it passes. PushPull/Push/Pull return futures at
// once; both buffers must stay alive and untouched until the future is ready: the library
// reads the gradient on its compression threads after the call returned (it is not
// copied: a copy would cost one more pass over the gradient), and writes `out` before the
// future becomes ready. This is the contract of torch's asynchronous communication hooks
// (a DDP comm hook's bucket until its future completes) and of Horovod's handles (the
// tensor of `allreduce_async_` until `synchronize(handle)`). With compression_threads = 0
// the gradient is read before the call returns, as before.
// Thread-safety: all methods are thread-safe; operations on one tensor must not overlap
// (wait for the previous future of that tensor); different tensors may be in flight at once.
// Failure: every method returns a status; the library never aborts the process. Codes:
// kInvalidArgument (unknown tensor, wrong length, bad option), kUnavailable (server or
// scheduler gone), kDeadlineExceeded (no answer in time, e.g. a missing worker in sync
// mode), kFailedPrecondition (stopped, or wrong order of calls), kDataLoss (bad message).
//
// Several Workers may live in one process (no globals).
#ifndef ADAPS_WORKER_H_
#define ADAPS_WORKER_H_

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace adaps {

class TransportContext;  // common/transport.h; only for in-process (inproc://) clusters

enum class Compression { kDense = 0, kAdaComp = 1, kTopK = 2, kSign = 3 };
// kDense: the servers' parameters. kRecompressed: AdaComp over their change, with a
// downlink residue (the replica trails the parameters by it). kSparse: the step's exact
// change, as the step's pushes forwarded for the worker to replay (a mean or SGD step), the
// new values at the elements some worker sent, or the dense parameters, whichever is
// smallest (schemas/README.md "Sparse pulls"): the output is bit for bit a dense pull's. Only for servers whose step changes just those elements (--optimizer=mean, sum,
// or sgd without weight decay, sync mode); Declare fails with kFailedPrecondition otherwise.
// With --optimizer=mean the output is the step's mean gradient, 0 where no worker sent.
enum class PullFormat { kDense = 0, kRecompressed = 1, kSparse = 2 };

struct WorkerOptions {
  std::string scheduler;  // e.g. tcp://127.0.0.1:5000
  std::string identity;   // optional stable identity (a restarted worker keeps its rank)
  // Waiting for the whole cluster to register.
  absl::Duration register_timeout = absl::Seconds(60);
  // How long the worker keeps training without hearing from the scheduler (re-registering
  // when a restarted one answers) before every operation fails with kUnavailable. The
  // servers follow the same policy (adaps-server --scheduler_grace_s).
  absl::Duration scheduler_grace = absl::Seconds(60);
  // Every push, pull, declare and barrier request.
  absl::Duration request_timeout = absl::Seconds(30);
  // Compact (Rice) index coding on the wire; false sends plain 32-bit indices.
  bool compact_indices = true;
  // Fusion of small tensors (docs/architecture.md "Fusion"): tensors of fewer bytes than
  // this travel together in one push and one pull message per step (a bucket on one
  // server), each keeping its own residue and bin size. 0 turns fusion off. Every fused
  // tensor must then be given (PushPull, Push or Pull: the same for all) once per step: the
  // bucket is sent when all its members were given, and fails with kDeadlineExceeded when
  // that did not happen within request_timeout.
  uint64_t fusion_threshold_bytes = 256 * 1024;
  std::string log_level = "info";
  std::shared_ptr<TransportContext> context;  // null: the worker makes its own
  // ZeroMQ CURVE (Z85 keys, 40 characters; see docs/reliability.md): set all three to
  // encrypt and authenticate. The server key is the cluster's (scheduler and servers); the
  // worker's public key must be in their allowed-clients list.
  std::string curve_server_public_key;
  std::string curve_public_key;
  std::string curve_secret_key;
  // Sets the three keys above from adaps-keygen's files: the cluster's server key (its .pub
  // is enough) and this worker's own pair. Both empty: plaintext, nothing set.
  // kInvalidArgument when only one is given or a key is malformed, kNotFound for an
  // unreadable file (the message names it); the options are unchanged then.
  absl::Status LoadCurveKeys(const std::string& server_key_file,
                             const std::string& client_key_file);
  // Prometheus metrics of this worker (docs/operations.md lists them) on
  // http://metrics_host:metrics_port/metrics, served by threads the Worker owns from Create
  // until Stop. -1 (the default): off, nothing is served and the hot paths pay one branch;
  // 0: the OS picks a port, written to metrics_port_file when that is set. Create fails
  // with kUnavailable when the port is in use and kInvalidArgument above 65535. Series carry
  // role="worker" and this worker's rank.
  int metrics_port = -1;
  std::string metrics_host = "0.0.0.0";
  std::string metrics_port_file;
  // Threads that compress pushes and decode pull answers, so that PushPull/Push return at
  // once and compression overlaps the trainer's backward pass (and the decoding of answers
  // stays off the I/O thread). Pushes are encoded and sent in the order of the calls (FIFO
  // per worker: a later tensor never overtakes an earlier one). 0: compress on the calling
  // thread and decode on the I/O thread. 1 (the default) takes one core beside the
  // trainer's; more help only when several large tensors are in flight at once and cores
  // are free. kInvalidArgument below 0 or above 64.
  int compression_threads = 1;
  // Tensors declared on a device (TensorSpec::device) live in host memory instead, and the
  // CPU codec does what the GPU would, through the same device path: for testing that path,
  // and a trainer's use of it, on machines without a GPU. Off by default.
  bool emulate_devices = false;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // the number of elements is the product
  uint32_t bin_size = 500;     // AdaComp bin size T (~50 conv, ~500 fully-connected)
  Compression compression = Compression::kAdaComp;
  double topk_fraction = 0.001;
  PullFormat pull = PullFormat::kDense;
  // Recompressed pulls: the servers recompress this tensor's change at bin_size /
  // pull_bin_divisor (at least 1; 0 or 1: at bin_size; capped by the servers'
  // --pull_bin_size). The servers' downlink compresses what all the workers sent, several
  // times as many elements as one push: a smaller bin keeps it from holding them back.
  // With servers running `mean` (local mode), a tensor pulled recompressed is the running
  // sum of the steps' means added to its initial values (server/shard.h, set_running_mean).
  uint32_t pull_bin_divisor = 1;
  // With servers running `mean` and a dense or sparse pull (local mode's update exchange,
  // where each pull is the step's exact mean and every worker adds it to its replica): the
  // servers also keep the running sum of the means added to the initial values (one more
  // float per element there), and a worker that joins the running job gets that sum from
  // Declare instead of the step's mean: where every replica is. (Recompressed pulls hold
  // that sum anyway; ignored for them and on other servers.) adaps::LocalSteps and
  // adaps.torch's local mode set it. Not with pull_in_place.
  bool keep_sum = false;
  // Whether this tensor may be fused with other small ones (WorkerOptions::
  // fusion_threshold_bytes). false for a tensor not given every step, e.g. one only declared
  // to broadcast rank 0's values: a bucket waits for all its members.
  bool fuse = true;
  // Zero-copy pulls (ps-lite's ZPull): the buffer given to Declare becomes the replica the
  // pull answers change, so a sparse or recompressed answer writes only the elements it
  // names and the tensor is not copied each step (a dense answer is copied in as always).
  // Every PushPull/Pull of the tensor must then pass that buffer as `out` (any other is
  // kInvalidArgument), and the caller keeps it alive while the Worker lives and never
  // writes it; it reads it between steps, as any `out`. For a trainer that only reads the
  // parameters it pulls (servers running the optimizer); not for one that steps them itself
  // (local mode: the replica would be the trainer's own step, not the servers'). Such a
  // tensor is never fused (`fuse` is ignored); PullParameters needs another buffer.
  bool pull_in_place = false;
  // The CUDA device (its ordinal) this tensor's gradients and parameters live on; -1 (the
  // default): host memory. Its residues are then kept on that device and its pushes
  // compressed there (the AdaComp kernels, docs/gpu.md): only the encoded update crosses to
  // the host. A recompressed pull is added to a copy of the replica on the device and copied
  // into `out`; a dense pull is copied once into `out`. Give it with PushPullOnDevice,
  // PushOnDevice and PullOnDevice (device pointers and a stream, as NCCL takes them);
  // Declare, PullParameters, Residue, SetResidue and the residue files still take host
  // memory. Compression kAdaComp or kDense, pull kDense or kRecompressed, not pull_in_place;
  // never fused. kUnimplemented at Declare when this library was built without CUDA,
  // kUnavailable without a usable GPU.
  int device = -1;
};

// Traffic of one tensor since it was declared. Wire bytes count every frame (FlatBuffers
// header and payload); dense bytes are what uncompressed float32 would have been.
struct TrafficCounters {
  uint64_t pushes = 0;
  uint64_t pulls = 0;
  uint64_t push_wire_bytes = 0;
  uint64_t pull_wire_bytes = 0;
  uint64_t push_dense_bytes = 0;
  uint64_t pull_dense_bytes = 0;
  // Time this worker spent encoding the pushes (compression) and applying the pull answers
  // (decoding into `out`), summed over the threads that did it.
  double compress_seconds = 0;
  double decode_seconds = 0;
  // The servers' engine work on the versions this tensor's pulls received, as the servers
  // reported it in their answers (decode-adds, optimizer, encoding), summed over slices.
  double server_seconds = 0;
  // Sparse pulls: the slice answers the servers sent sparse (the merged list of new values),
  // forwarded (a mean or SGD step's pushes, replayed) and dense (no larger, or the only exact
  // answer), per slice per step.
  uint64_t pulls_answered_sparse = 0;
  uint64_t pulls_answered_forwarded = 0;
  uint64_t pulls_answered_dense = 0;
};

// Where one slice of a tensor lives.
struct SliceInfo {
  uint64_t offset = 0;
  uint32_t length = 0;
  int server = 0;
};

class Worker {
 public:
  // Connects and registers; returns once the cluster view arrived. kUnavailable when the
  // scheduler is unreachable, kDeadlineExceeded when the cluster did not form in time,
  // kInvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<Worker>> Create(const WorkerOptions& options);
  ~Worker();  // Stop()
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  int rank() const;
  // One past the highest worker rank of the job (--num_workers, more once workers joined:
  // a worker that joined a running job has a rank of at least the starting count).
  int num_workers() const;
  // The workers live in the latest cluster view, this one included: how many workers the
  // servers' steps average over now (it changes as workers join, leave or die).
  int live_workers() const;
  int num_servers() const;
  // The servers' --optimizer ("mean": local mode, a pull answers the step's mean; "sgd",
  // "momentum", "nesterov", "adam": server mode, a pull answers parameters; "sum"), from the
  // cluster view; empty when the servers did not say (an older adaps-server).
  std::string server_optimizer() const;
  // This worker registered into a running job: it joined it (adaps-scheduler --max_workers)
  // or came back after a restart. The job's start-up barriers are behind the others, so a
  // trainer does not wait at them (Declare already skips its own).
  bool rejoined() const;

  // Collective: every worker declares the same tensors in the same order. Rank 0's
  // `values` become the initial parameters; on return `values` holds them on every worker.
  // kInvalidArgument for a bad spec or a conflicting earlier declaration.
  absl::Status Declare(const TensorSpec& spec, absl::Span<float> values);
  // Tensors declared from now on are fused into new buckets, never with the ones declared
  // before: a group of tensors given at its own time each step (one optimizer's, when a
  // trainer steps two separately, e.g. a GAN's generator and discriminator) gets buckets
  // of its own, so neither waits for the other's tensors. Collective like Declare (every
  // worker at the same point of its declarations).
  void CloseFusionBuckets();

  // Compresses `grad` (with the residues), pushes it, then pulls the parameters of the next
  // step into `out` (sync mode: after every worker pushed). The future holds the status.
  std::future<absl::Status> PushPull(absl::string_view name, absl::Span<const float> grad,
                                     absl::Span<float> out);
  // The two halves: Push sends step s; Pull waits for the parameters after the last push.
  std::future<absl::Status> Push(absl::string_view name, absl::Span<const float> grad);
  std::future<absl::Status> Pull(absl::string_view name, absl::Span<float> out);

  // The same for a tensor declared on a device (TensorSpec::device): `grad` and `out` are
  // that device's memory, the tensor's length each; `stream` is the trainer's CUDA stream
  // (a cudaStream_t; null: the default stream). The library's work waits for what was
  // given to `stream` before the call (an event), runs on a stream of its own, and has
  // written `out` when the future is ready. Calls as for the host ones; kInvalidArgument for
  // a tensor in host memory (and the host calls refuse a tensor on a device).
  std::future<absl::Status> PushPullOnDevice(absl::string_view name, const float* grad,
                                             float* out, void* stream = nullptr);
  std::future<absl::Status> PushOnDevice(absl::string_view name, const float* grad,
                                         void* stream = nullptr);
  std::future<absl::Status> PullOnDevice(absl::string_view name, float* out,
                                         void* stream = nullptr);

  // The servers' parameters of `name` as of their last completed step, exactly (a dense
  // pull of each of its slices), into `out` (the tensor's length); blocks. The tensor's
  // replica and residues are left alone, so this may be called between steps whatever the
  // tensor's pull format. With recompressed pulls the parameters PushPull writes are the
  // worker's replica, which trails the servers' by what the downlink has not sent yet
  // (the servers' residue); this gives the trained model itself, as a checkpoint holds it
  // (e.g. once at the end of training). Must not overlap another operation on the tensor.
  // kInvalidArgument for an undeclared tensor or a wrong length (`out` unchanged).
  absl::Status PullParameters(absl::string_view name, absl::Span<float> out);

  // The elements of `name` its last successful push sent, ascending: AdaComp's or Top-k's
  // selected elements, every element of a tensor sent dense (or sign). Empty before the
  // first push. For DGC's momentum factor masking (a trainer that pushes a velocity clears
  // it where the push sent it). kInvalidArgument for an undeclared tensor.
  absl::StatusOr<std::vector<uint32_t>> LastSent(absl::string_view name) const;

  // Copies into `out` what this worker's pushes of `name` hold back: the residue of its
  // error feedback (the gradient or update mass not sent yet), zeros for a tensor pushed
  // dense. With residues, the replica plus the residue is where this worker's own updates
  // alone would have taken the parameters. Must not overlap a push of the tensor.
  // kInvalidArgument for an undeclared tensor or a wrong length (`out` unchanged).
  absl::Status Residue(absl::string_view name, absl::Span<float> out) const;
  // Sets what `name`'s error feedback holds back to `values` (what Residue gave, e.g. from a
  // trainer's checkpoint), so that a restarted worker resumes exactly. Call it between
  // steps. kInvalidArgument for an undeclared or dense tensor, a wrong length or a value
  // that is not finite; nothing changes then.
  absl::Status SetResidue(absl::string_view name, absl::Span<const float> values);

  // Writes every declared tensor's residue (the tensors with error feedback) to the file
  // `path` on this worker's host, replacing it atomically, so that a worker restarted with
  // the same tensors can LoadResidues and send the mass the old one held back (the
  // replica, the optimizer's state and the servers' checkpoint are the caller's). Call it
  // between steps. kInternal with the path and the reason when the file cannot be written.
  absl::Status SaveResidues(const std::string& path) const;
  // Sets the residues from a file SaveResidues wrote: every tensor in it must be declared
  // here with the same length and with error feedback (declared tensors not in the file
  // keep theirs). Call it between steps, before the first push to resume exactly.
  // kNotFound (no file), kDataLoss (damaged), kInvalidArgument (a tensor unknown here, of
  // another length or dense); on any error no residue changes.
  absl::Status LoadResidues(const std::string& path);

  // Changes the AdaComp bin size T of `name`'s pushes, from the next push encoded on; the
  // residues are kept (e.g. DGC's sparsity warm-up: small bins, so denser pushes, over the
  // first steps). Only this worker's pushes change: the servers' recompressed pulls keep the
  // declared bin size. Call it between steps (when no push of `name` is queued), on every
  // worker alike if their traffic should match. A fused tensor (TensorSpec::fuse) changes
  // too: its bucket's pushes carry each member's bin size of the moment (the servers check
  // the members' lengths against the declared table, whose bin sizes stay the downlink's).
  // kInvalidArgument for an undeclared tensor, a bin size of 0 or a tensor that is not
  // compressed with AdaComp; nothing changes then.
  absl::Status SetBinSize(absl::string_view name, uint32_t bin_size);

  // Waits until every live worker reached the barrier (kDeadlineExceeded after the longer
  // of request_timeout and register_timeout).
  absl::Status Barrier();
  // Sets optimizer hyper-parameters on every server (learning_rate, momentum, weight_decay,
  // beta1, beta2, epsilon).
  absl::Status SetHyper(const std::vector<std::pair<std::string, double>>& params);
  // Asks every server to write its shard under `directory` (server-side path; empty: each
  // server's --checkpoint_dir). With a directory, this worker also writes its residues
  // there on its own host (created if missing), as ResidueCheckpointPath(directory) names
  // it, so that a worker restarted with the same identity (or rank) resumes exactly with
  // LoadResidues; every worker that calls it writes its own. kInternal with the path when
  // that file cannot be written (the servers' shards are written by then).
  absl::Status Checkpoint(const std::string& directory);
  // The file Checkpoint(directory) writes this worker's residues to:
  // directory/worker-<identity, or r<rank> without one>.residues.
  std::string ResidueCheckpointPath(const std::string& directory) const;

  // kInvalidArgument for an undeclared tensor.
  absl::StatusOr<TrafficCounters> Traffic(absl::string_view name) const;
  absl::StatusOr<std::vector<SliceInfo>> Slices(absl::string_view name) const;
  std::vector<std::string> TensorNames() const;

  // Leaves the job with nothing lost: pushes what every compressed tensor's error feedback
  // still holds back (its residue, dense, as the tensor's next step; no pull), so that the
  // servers' parameters carry every gradient this worker was given, then Stop. Call it
  // between steps, with no operation in flight. Residues are zero afterwards. In sync mode
  // the others' step that takes these pushes completes once this worker has left.
  absl::Status Leave();

  // Tells the scheduler this worker is done (waiting up to request_timeout for its answer)
  // and closes the connections. What the residues hold is not sent (Leave sends it). Operations still queued for compression fail with
  // kFailedPrecondition; every future is ready when it returns. Idempotent.
  absl::Status Stop();

  class Impl;

 private:
  explicit Worker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace adaps

#endif  // ADAPS_WORKER_H_
