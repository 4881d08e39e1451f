// The server's checkpoint file: its format and its durable write and fallback read, as pure
// functions over plain slice records (no Server, no sockets).
//
// File (format 5): "ADAPSCK5" | string job id | u64 count | per hyperparameter set at run
// time (SetHyper): string name, f64 value | u64 slice count | per slice: u64 key, u32
// length, u32 bin size, u64 version, u64 adam_t, u64 down_base, u64 down_version, u32 flags
// (bit 0: running mean, Shard::set_running_mean; bit 1: a running sum kept, Shard::KeepSum;
// bit 2: that sum lost; bits 8-31: the downlink bin divisor, Shard::set_downlink_bin_divisor;
// bits 3-7 0), string name, then the float arrays params, m, v, published, downlink residue
// and, with bit 1, the sum (each u64 count + floats) | u32
// CRC-32 of everything before it. A string is u64 size + bytes. Format 4 ("ADAPSCK4") is the
// same without the flags, format 3 ("ADAPSCK3") also without the hyperparameters, format 2
// ("ADAPSCK2") also without the job id; all are still read (as "no flags", "none", "no job
// id"). Native byte order: a checkpoint moves with its server.
//
// Thread-safety: the functions share nothing; two writers of the same path race.
#ifndef ADAPS_SERVER_CHECKPOINT_H_
#define ADAPS_SERVER_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/file_io.h"  // Crc32: the checksum the file format ends with

namespace adaps {

// One slice as a checkpoint holds it.
struct SliceRecord {
  uint64_t key = 0;
  uint32_t length = 0;
  uint32_t bin_size = 0;
  uint64_t version = 0;
  uint64_t adam_t = 0;
  uint64_t down_base = 0;
  uint64_t down_version = 0;
  bool running_mean = false;  // Shard::set_running_mean (format 5 on; false before)
  uint32_t down_bin_divisor = 1;  // Shard::set_downlink_bin_divisor (format 5 on; 1 before)
  // Shard::KeepSum: kept, and lost (flag bits 1 and 2); `sum` written only when kept.
  bool keep_sum = false;
  bool sum_lost = false;
  std::string name;
  std::vector<float> params, m, v, published, residue, sum;
};

// Hyperparameters set at run time (SetHyper), by name (common/optimizer.h SetHyperParam).
using HyperValues = std::vector<std::pair<std::string, double>>;

// dir/server-<rank>.ckpt.
std::string CheckpointPath(const std::string& dir, int rank);

// The file's bytes (format 5) for `slices`, in the order given, of job `job_id`.
std::vector<uint8_t> EncodeCheckpoint(const std::vector<SliceRecord>& slices,
                                      const std::string& job_id = "",
                                      const HyperValues& hyper = {});

// The records of a whole file's bytes (format 5, 4, 3 or 2); its job id goes to `job_id` when
// given (empty for format 2), its hyperparameters to `hyper` (none before format 4). kDataLoss ("checkpoint <name> is damaged: ...") for a bad
// magic, a checksum mismatch, a truncated or inconsistent record or trailing bytes. `name`
// only goes into the messages.
absl::StatusOr<std::vector<SliceRecord>> DecodeCheckpoint(absl::Span<const uint8_t> bytes,
                                                          const std::string& name,
                                                          std::string* job_id = nullptr,
                                                          HyperValues* hyper = nullptr);

// Writes `slices` of job `job_id` to `path` durably: to path.tmp, fsynced, the old `path`
// kept as path.prev, path.tmp renamed to `path`, the directory fsynced. kInternal, naming the
// file and errno, when a step fails (an existing `path` is then still whole).
absl::Status WriteCheckpointFile(const std::string& path, const std::vector<SliceRecord>& slices,
                                 const std::string& job_id = "", const HyperValues& hyper = {});

// The records of one file: kNotFound when it does not exist, kDataLoss when damaged.
absl::StatusOr<std::vector<SliceRecord>> ReadCheckpointFile(const std::string& path,
                                                            std::string* job_id = nullptr,
                                                            HyperValues* hyper = nullptr);

// What a restore found at `path`, falling back to path.prev when `path` is damaged/absent.
struct RestoredCheckpoint {
  bool found = false;          // false: neither file exists (start fresh)
  bool from_previous = false;  // the records came from path.prev
  absl::Status refused;        // why `path` was not used when from_previous
  std::string job_id;          // of the file used; empty: format 2 (no job id)
  HyperValues hyper;           // of the file used
  std::vector<SliceRecord> slices;
};

// kDataLoss ("no usable checkpoint: ...") when a file exists but no copy is usable.
absl::StatusOr<RestoredCheckpoint> ReadCheckpointWithFallback(const std::string& path);

// Step checkpoints (--checkpoint_every_steps=N): every slice of the server recorded at the
// same step K (a multiple of N), written to dir/server-<name>.step-<K>.ckpt (the same file
// format) by each server on its own when all its slices reached K. Since every server
// records the same steps, a step that every server has is one consistent model: the
// scheduler tells a (re)starting server the latest such step (ClusterView.restore_step,
// from the steps each server reports in Register and Heartbeat), and it restores that one.
// `name` is the server's --identity (stable across restarts), else its rank.
std::string StepCheckpointPath(const std::string& dir, const std::string& name, uint64_t step);
// The steps of `name`'s step checkpoints in `dir`, ascending (from the file names; a
// damaged file is found out when restored). Empty when `dir` cannot be read.
std::vector<uint64_t> ListStepCheckpoints(const std::string& dir, const std::string& name);
// Removes `name`'s step checkpoints older than both the newest `keep` and `common` (the
// latest step every server has, which a restart may be told to restore; 0: none).
void PruneStepCheckpoints(const std::string& dir, const std::string& name, size_t keep,
                          uint64_t common = 0);
// Removes `name`'s step checkpoints after `step`: a server that restored `step` (0: none)
// goes on from there, and its later files belong to a past it no longer has. Otherwise a
// server restarting later could be told a newer common step than the one restored here.
void RemoveStepCheckpointsAfter(const std::string& dir, const std::string& name, uint64_t step);
// The step every server restores from: LatestCommonStep (common/step_checkpoint.h).

// A server with --identity remembers its rank in dir/server-<identity>.rank (written once the
// scheduler told it the rank, read when it starts). A server restarted while the scheduler is
// down too claims that rank in its first Register, so the restarted scheduler gives it the
// rank whose checkpoint its directory holds, not whichever rank is free first (two servers
// restarted together would otherwise swap ranks and find no checkpoint of their new one).
std::string RankFilePath(const std::string& dir, const std::string& identity);
// The rank in that file: -1 when there is none; kDataLoss when it holds anything else.
absl::StatusOr<int> ReadRankFile(const std::string& dir, const std::string& identity);
// Writes it durably (kInternal naming the file and errno on failure).
absl::Status WriteRankFile(const std::string& dir, const std::string& identity, int rank);

}  // namespace adaps

#endif  // ADAPS_SERVER_CHECKPOINT_H_
