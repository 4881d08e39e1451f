// Files written whole and durably and read whole, and the little-endian records inside them:
// what the servers' checkpoints and a worker's residue file are made of.
#ifndef ADAPS_COMMON_FILE_IO_H_
#define ADAPS_COMMON_FILE_IO_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace adaps {

// CRC-32 (IEEE, reflected, as zlib) of `data`, continuing from `crc`.
uint32_t Crc32(absl::Span<const uint8_t> data, uint32_t crc = 0);

// Replaces `path` with `bytes` durably: written to path + ".tmp" and fsynced, renamed over
// `path`, the directory fsynced. With `keep_previous_as`, an existing `path` is first renamed
// to it (a fallback when the new file is found damaged). A failure is the process's own
// problem (disk full, permissions, a missing directory): kInternal with the path and errno,
// never kUnavailable, which workers retry as a server restart.
absl::Status ReplaceFileDurably(const std::string& path, const std::vector<uint8_t>& bytes,
                                const std::string& keep_previous_as = "");
// The whole file; kNotFound when it cannot be opened.
absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path);

// Appends native-endian values, length-prefixed float arrays and strings.
class RecordWriter {
 public:
  template <typename T>
  void Put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void PutFloats(absl::Span<const float> v);
  void PutString(const std::string& s);
  std::vector<uint8_t> bytes;
};

// Reads what RecordWriter wrote; every Get is false (and reads nothing) past the end.
class RecordReader {
 public:
  explicit RecordReader(absl::Span<const uint8_t> b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // At most `max` floats.
  bool GetFloats(std::vector<float>* v, uint64_t max);
  bool GetString(std::string* s);
  bool AtEnd() const { return pos_ == b_.size(); }

 private:
  absl::Span<const uint8_t> b_;
  size_t pos_ = 0;
};

}  // namespace adaps

#endif  // ADAPS_COMMON_FILE_IO_H_
