// The server's checkpoint file: its format and its durable write and fallback read, as pure
// functions over plain slice records (no Server, no sockets).
//
// File (format 3): "ADAPSCK3" | string job id | u64 slice count | per slice: u64 key, u32
// length, u32 bin size, u64 version, u64 adam_t, u64 down_base, u64 down_version, string
// name, then the float arrays params, m, v, published, downlink residue (each u64 count +
// floats) | u32 CRC-32 of everything before it. A string is u64 size + bytes. Format 2
// ("ADAPSCK2") is the same without the job id; it is still read (as "no job id"). Native
// byte order: a checkpoint moves with its server.
//
// Thread-safety: the functions share nothing; two writers of the same path race.
#ifndef ADAPS_SERVER_CHECKPOINT_H_
#define ADAPS_SERVER_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

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
  std::string name;
  std::vector<float> params, m, v, published, residue;
};

// dir/server-<rank>.ckpt.
std::string CheckpointPath(const std::string& dir, int rank);

// CRC-32 (IEEE, reflected, as zlib) of `data`, continuing from `crc`.
uint32_t Crc32(absl::Span<const uint8_t> data, uint32_t crc = 0);

// The file's bytes (format 3) for `slices`, in the order given, of job `job_id`.
std::vector<uint8_t> EncodeCheckpoint(const std::vector<SliceRecord>& slices,
                                      const std::string& job_id = "");

// The records of a whole file's bytes (format 3 or 2); its job id goes to `job_id` when
// given (empty for format 2). kDataLoss ("checkpoint <name> is damaged: ...") for a bad
// magic, a checksum mismatch, a truncated or inconsistent record or trailing bytes. `name`
// only goes into the messages.
absl::StatusOr<std::vector<SliceRecord>> DecodeCheckpoint(absl::Span<const uint8_t> bytes,
                                                          const std::string& name,
                                                          std::string* job_id = nullptr);

// Writes `slices` of job `job_id` to `path` durably: to path.tmp, fsynced, the old `path`
// kept as path.prev, path.tmp renamed to `path`, the directory fsynced. kUnavailable when a
// step fails (an existing `path` is then still whole).
absl::Status WriteCheckpointFile(const std::string& path, const std::vector<SliceRecord>& slices,
                                 const std::string& job_id = "");

// The records of one file: kNotFound when it does not exist, kDataLoss when damaged.
absl::StatusOr<std::vector<SliceRecord>> ReadCheckpointFile(const std::string& path,
                                                            std::string* job_id = nullptr);

// What a restore found at `path`, falling back to path.prev when `path` is damaged/absent.
struct RestoredCheckpoint {
  bool found = false;          // false: neither file exists (start fresh)
  bool from_previous = false;  // the records came from path.prev
  absl::Status refused;        // why `path` was not used when from_previous
  std::string job_id;          // of the file used; empty: format 2 (no job id)
  std::vector<SliceRecord> slices;
};

// kDataLoss ("no usable checkpoint: ...") when a file exists but no copy is usable.
absl::StatusOr<RestoredCheckpoint> ReadCheckpointWithFallback(const std::string& path);

}  // namespace adaps

#endif  // ADAPS_SERVER_CHECKPOINT_H_
