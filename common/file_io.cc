#include "common/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace adaps {

uint32_t Crc32(absl::Span<const uint8_t> data, uint32_t crc) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (uint8_t b : data) crc = table[(crc ^ b) & 0xff] ^ (crc >> 8);
  return ~crc;
}

namespace {

absl::Status FileError(int err, absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, path, ": ", std::strerror(err)));
}

absl::Status WriteFileDurably(const std::string& path, const std::vector<uint8_t>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return FileError(errno, "cannot create ", path);
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const absl::Status st = FileError(errno, "short write to ", path);
      ::close(fd);
      return st;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const absl::Status st = FileError(errno, "cannot fsync ", path);
    ::close(fd);
    return st;
  }
  if (::close(fd) != 0) return FileError(errno, "cannot close ", path);
  return absl::OkStatus();
}

void SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::Status ReplaceFileDurably(const std::string& path, const std::vector<uint8_t>& bytes,
                                const std::string& keep_previous_as) {
  const std::string tmp = path + ".tmp";
  absl::Status written = WriteFileDurably(tmp, bytes);
  if (!written.ok()) return written;
  if (!keep_previous_as.empty() && ::access(path.c_str(), F_OK) == 0 &&
      std::rename(path.c_str(), keep_previous_as.c_str()) != 0) {
    return FileError(errno,
                     absl::StrCat("cannot keep the previous file as ", keep_previous_as, ": "),
                     path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    return FileError(err, absl::StrCat("cannot rename ", tmp, " to "), path);
  }
  SyncDirectory(DirectoryOf(path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

void RecordWriter::PutFloats(absl::Span<const float> v) {
  Put<uint64_t>(v.size());
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  bytes.insert(bytes.end(), p, p + v.size() * sizeof(float));
}

void RecordWriter::PutString(const std::string& s) {
  Put<uint64_t>(s.size());
  bytes.insert(bytes.end(), s.begin(), s.end());
}

bool RecordReader::GetFloats(std::vector<float>* v, uint64_t max) {
  uint64_t n;
  if (!Get(&n) || n > max || (b_.size() - pos_) / sizeof(float) < n) return false;
  v->resize(n);
  if (n) std::memcpy(v->data(), b_.data() + pos_, n * sizeof(float));
  pos_ += n * sizeof(float);
  return true;
}

bool RecordReader::GetString(std::string* s) {
  uint64_t n;
  if (!Get(&n) || n > b_.size() - pos_) return false;
  s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
  pos_ += n;
  return true;
}

}  // namespace adaps
