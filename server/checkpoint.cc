#include "server/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/file_io.h"
#include "common/status_macros.h"

namespace adaps {
namespace {

constexpr char kCheckpointMagic[8] = {'A', 'D', 'A', 'P', 'S', 'C', 'K', '5'};
constexpr char kCheckpointMagicV4[8] = {'A', 'D', 'A', 'P', 'S', 'C', 'K', '4'};
constexpr char kCheckpointMagicV3[8] = {'A', 'D', 'A', 'P', 'S', 'C', 'K', '3'};
constexpr char kCheckpointMagicV2[8] = {'A', 'D', 'A', 'P', 'S', 'C', 'K', '2'};

constexpr uint32_t kRunningMeanFlag = 1;
constexpr uint32_t kKeepSumFlag = 2;
constexpr uint32_t kSumLostFlag = 4;
constexpr uint32_t kDivisorShift = 8;
constexpr uint32_t kUnusedFlags = 0xF8u;

bool ReadRecord(RecordReader& r, SliceRecord& s, bool with_flags) {
  uint32_t flags = 0;
  const bool head = r.Get(&s.key) && r.Get(&s.length) && r.Get(&s.bin_size) &&
                    r.Get(&s.version) && r.Get(&s.adam_t) && r.Get(&s.down_base) &&
                    r.Get(&s.down_version) && (!with_flags || r.Get(&flags));
  s.running_mean = (flags & kRunningMeanFlag) != 0;
  s.keep_sum = (flags & kKeepSumFlag) != 0;
  s.sum_lost = (flags & kSumLostFlag) != 0;
  s.down_bin_divisor = std::max(1u, flags >> kDivisorShift);
  return head && (flags & kUnusedFlags) == 0 && r.GetString(&s.name) &&
         r.GetFloats(&s.params, s.length) && r.GetFloats(&s.m, s.length) &&
         r.GetFloats(&s.v, s.length) && r.GetFloats(&s.published, s.length) &&
         r.GetFloats(&s.residue, s.length) && (!s.keep_sum || r.GetFloats(&s.sum, s.length));
}

}  // namespace

std::string CheckpointPath(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/server-", rank, ".ckpt");
}

std::string StepCheckpointPath(const std::string& dir, const std::string& name, uint64_t step) {
  return absl::StrCat(dir, "/server-", name, ".step-", step, ".ckpt");
}

std::vector<uint64_t> ListStepCheckpoints(const std::string& dir, const std::string& name) {
  std::vector<uint64_t> steps;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return steps;
  const std::string prefix = absl::StrCat("server-", name, ".step-");
  const std::string suffix = ".ckpt";
  while (const dirent* e = ::readdir(d)) {
    const std::string file = e->d_name;
    if (file.size() <= prefix.size() + suffix.size() || file.rfind(prefix, 0) != 0 ||
        file.compare(file.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    uint64_t step = 0;
    if (absl::SimpleAtoi(file.substr(prefix.size(), file.size() - prefix.size() - suffix.size()),
                         &step) &&
        step > 0) {
      steps.push_back(step);
    }
  }
  ::closedir(d);
  std::sort(steps.begin(), steps.end());
  return steps;
}

void RemoveStepCheckpointsAfter(const std::string& dir, const std::string& name, uint64_t step) {
  for (uint64_t s : ListStepCheckpoints(dir, name)) {
    if (s <= step) continue;
    const std::string path = StepCheckpointPath(dir, name, s);
    std::remove(path.c_str());
    std::remove((path + ".prev").c_str());
  }
}

std::string RankFilePath(const std::string& dir, const std::string& identity) {
  return absl::StrCat(dir, "/server-", identity, ".rank");
}

absl::StatusOr<int> ReadRankFile(const std::string& dir, const std::string& identity) {
  const std::string path = RankFilePath(dir, identity);
  absl::StatusOr<std::vector<uint8_t>> bytes = ReadFileBytes(path);
  if (absl::IsNotFound(bytes.status())) return -1;
  if (!bytes.ok()) return bytes.status();
  const std::string text(bytes->begin(), bytes->end());
  int rank = -1;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &rank) || rank < 0) {
    return absl::DataLossError(absl::StrCat("rank file ", path, " does not hold a rank"));
  }
  return rank;
}

absl::Status WriteRankFile(const std::string& dir, const std::string& identity, int rank) {
  const std::string text = absl::StrCat(rank, "\n");
  return ReplaceFileDurably(RankFilePath(dir, identity),
                            std::vector<uint8_t>(text.begin(), text.end()));
}

void PruneStepCheckpoints(const std::string& dir, const std::string& name, size_t keep,
                          uint64_t common) {
  std::vector<uint64_t> steps = ListStepCheckpoints(dir, name);
  for (size_t i = 0; i + keep < steps.size() && (common == 0 || steps[i] < common); ++i) {
    const std::string path = StepCheckpointPath(dir, name, steps[i]);
    std::remove(path.c_str());
    std::remove((path + ".prev").c_str());
  }
}

std::vector<uint8_t> EncodeCheckpoint(const std::vector<SliceRecord>& slices,
                                      const std::string& job_id, const HyperValues& hyper) {
  RecordWriter w;
  w.Put(kCheckpointMagic);
  w.PutString(job_id);
  w.Put<uint64_t>(hyper.size());
  for (const auto& [name, value] : hyper) {
    w.PutString(name);
    w.Put<double>(value);
  }
  w.Put<uint64_t>(slices.size());
  for (const SliceRecord& s : slices) {
    w.Put<uint64_t>(s.key);
    w.Put<uint32_t>(s.length);
    w.Put<uint32_t>(s.bin_size);
    w.Put<uint64_t>(s.version);
    w.Put<uint64_t>(s.adam_t);
    w.Put<uint64_t>(s.down_base);
    w.Put<uint64_t>(s.down_version);
    const uint32_t divisor = std::min(s.down_bin_divisor, (1u << (32 - kDivisorShift)) - 1);
    w.Put<uint32_t>((s.running_mean ? kRunningMeanFlag : 0) | (s.keep_sum ? kKeepSumFlag : 0) |
                    (s.keep_sum && s.sum_lost ? kSumLostFlag : 0) | (divisor << kDivisorShift));
    w.PutString(s.name);
    w.PutFloats(s.params);
    w.PutFloats(s.m);
    w.PutFloats(s.v);
    w.PutFloats(s.published);
    w.PutFloats(s.residue);
    if (s.keep_sum) w.PutFloats(s.sum);
  }
  w.Put<uint32_t>(Crc32(w.bytes));
  return std::move(w.bytes);
}

absl::StatusOr<std::vector<SliceRecord>> DecodeCheckpoint(absl::Span<const uint8_t> bytes,
                                                          const std::string& name,
                                                          std::string* job_id,
                                                          HyperValues* hyper) {
  auto damaged = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("checkpoint ", name, " is damaged: ", why));
  };
  const bool v5 = bytes.size() >= sizeof(kCheckpointMagic) &&
                  std::memcmp(bytes.data(), kCheckpointMagic, sizeof(kCheckpointMagic)) == 0;
  const bool v4 = v5 || (bytes.size() >= sizeof(kCheckpointMagicV4) &&
                         std::memcmp(bytes.data(), kCheckpointMagicV4, 8) == 0);
  const bool v3 = v4 || (bytes.size() >= sizeof(kCheckpointMagicV3) &&
                         std::memcmp(bytes.data(), kCheckpointMagicV3, 8) == 0);
  const bool v2 = bytes.size() >= sizeof(kCheckpointMagicV2) &&
                  std::memcmp(bytes.data(), kCheckpointMagicV2, sizeof(kCheckpointMagicV2)) == 0;
  if (bytes.size() < sizeof(kCheckpointMagic) + 12 || (!v3 && !v2)) {
    return damaged("not an adaps checkpoint (bad magic or too short)");
  }
  uint32_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 4, 4);
  if (Crc32(bytes.subspan(0, bytes.size() - 4)) != stored) return damaged("checksum mismatch");
  RecordReader r(bytes.subspan(sizeof(kCheckpointMagic), bytes.size() - 12));
  std::string job;
  if (v3 && !r.GetString(&job)) return damaged("truncated job id");
  HyperValues values;
  uint64_t hyper_count = 0;
  if (v4 && !r.Get(&hyper_count)) return damaged("truncated hyperparameters");
  for (uint64_t i = 0; i < hyper_count; ++i) {
    std::pair<std::string, double> v;
    if (!r.GetString(&v.first) || !r.Get(&v.second)) return damaged("truncated hyperparameter");
    values.push_back(std::move(v));
  }
  uint64_t count;
  if (!r.Get(&count)) return damaged("truncated");
  std::vector<SliceRecord> slices;
  for (uint64_t i = 0; i < count; ++i) {
    SliceRecord s;
    if (!ReadRecord(r, s, v5)) return damaged("truncated or unknown slice record");
    if (s.length == 0 || s.bin_size == 0 || s.params.size() != s.length ||
        s.published.size() != s.length || s.residue.size() != s.length) {
      return damaged("inconsistent slice record");
    }
    slices.push_back(std::move(s));
  }
  if (!r.AtEnd()) return damaged("trailing bytes");
  if (job_id != nullptr) *job_id = std::move(job);
  if (hyper != nullptr) *hyper = std::move(values);
  return slices;
}

absl::Status WriteCheckpointFile(const std::string& path, const std::vector<SliceRecord>& slices,
                                 const std::string& job_id, const HyperValues& hyper) {
  // Keep the previous checkpoint: if this one is found damaged at restore, that one is used.
  return ReplaceFileDurably(path, EncodeCheckpoint(slices, job_id, hyper), path + ".prev");
}

absl::StatusOr<std::vector<SliceRecord>> ReadCheckpointFile(const std::string& path,
                                                            std::string* job_id,
                                                            HyperValues* hyper) {
  absl::StatusOr<std::vector<uint8_t>> bytes = ReadFileBytes(path);
  if (!bytes.ok()) return absl::NotFoundError(absl::StrCat("no checkpoint at ", path));
  return DecodeCheckpoint(*bytes, path, job_id, hyper);
}

absl::StatusOr<RestoredCheckpoint> ReadCheckpointWithFallback(const std::string& path) {
  RestoredCheckpoint out;
  absl::StatusOr<std::vector<SliceRecord>> latest =
      ReadCheckpointFile(path, &out.job_id, &out.hyper);
  if (latest.ok()) {
    out.found = true;
    out.slices = *std::move(latest);
    return out;
  }
  absl::StatusOr<std::vector<SliceRecord>> previous =
      ReadCheckpointFile(path + ".prev", &out.job_id, &out.hyper);
  if (latest.status().code() == absl::StatusCode::kNotFound &&
      previous.status().code() == absl::StatusCode::kNotFound) {
    return out;
  }
  if (previous.ok()) {
    out.found = true;
    out.from_previous = true;
    out.refused = latest.status();
    out.slices = *std::move(previous);
    return out;
  }
  return absl::DataLossError(absl::StrCat("no usable checkpoint: ", latest.status().message(),
                                          "; ", previous.status().message()));
}

}  // namespace adaps
