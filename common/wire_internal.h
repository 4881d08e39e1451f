// Internals of the wire codec (common/wire_codec.h), shared by wire_codec.cc (headers, the
// update kinds, values) and wire_indices.cc (the index streams: Rice-coded gaps with packed
// signs, or plain 32-bit indices). Not part of the public interface.
#ifndef ADAPS_COMMON_WIRE_INTERNAL_H_
#define ADAPS_COMMON_WIRE_INTERNAL_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/compressor.h"
#include "common/wire_codec.h"

namespace adaps {
namespace wire_internal {

inline constexpr uint32_t kRiceEscape = 32;  // unary prefix of this many ones: raw 32-bit gap follows
// The Rice parameter byte: k in the low 5 bits, the number of padding bits of the stream's
// last byte (0..7) in the high 3, so the stream's exact bit length is known (format 2).
inline constexpr unsigned kRicePadShift = 5;
inline constexpr uint8_t kRiceKMask = 0x1f;

// ---- byte-level writer and reader -------------------------------------------------------

inline void PutU8(std::vector<uint8_t>* out, uint8_t v) { out->push_back(v); }

inline void PutVarint(std::vector<uint8_t>* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<uint8_t>(v));
}

inline void PutU32(std::vector<uint8_t>* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

inline void PutF32(std::vector<uint8_t>* out, float f) {
  uint32_t v;
  std::memcpy(&v, &f, 4);
  PutU32(out, v);
}

// Many 4-byte values at once, little-endian as PutU32/PutF32 write them: one resize and one
// copy (a sparse answer carries hundreds of thousands of values; a push_back per byte was 8%
// of a server's step).
template <typename T>
inline void PutWords(std::vector<uint8_t>* out, absl::Span<const T> words) {
  static_assert(sizeof(T) == 4, "4-byte words");
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire is little-endian");
  const size_t at = out->size();
  out->resize(at + 4 * words.size());
  if (!words.empty()) std::memcpy(out->data() + at, words.data(), 4 * words.size());
}

class ByteReader {
 public:
  explicit ByteReader(absl::Span<const uint8_t> b) : b_(b) {}
  size_t remaining() const { return b_.size() - pos_; }
  size_t pos() const { return pos_; }
  const uint8_t* here() const { return b_.data() + pos_; }

  absl::Status U8(uint8_t* v) {
    if (remaining() < 1) return Truncated();
    *v = b_[pos_++];
    return absl::OkStatus();
  }
  absl::Status U32(uint32_t* v) {
    if (remaining() < 4) return Truncated();
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>(b_[pos_ + i]) << (8 * i);
    pos_ += 4;
    *v = r;
    return absl::OkStatus();
  }
  absl::Status F32(float* f) {
    uint32_t v = 0;
    ADAPS_RETURN_IF_ERROR(U32(&v));
    std::memcpy(f, &v, 4);
    return absl::OkStatus();
  }
  absl::Status Varint32(uint32_t* v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 35; shift += 7) {
      uint8_t byte = 0;
      ADAPS_RETURN_IF_ERROR(U8(&byte));
      r |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) {
        if (r > std::numeric_limits<uint32_t>::max()) {
          return absl::DataLossError("varint exceeds 32 bits");
        }
        *v = static_cast<uint32_t>(r);
        return absl::OkStatus();
      }
    }
    return absl::DataLossError("varint longer than 5 bytes");
  }
  absl::Status Skip(size_t n) {
    if (remaining() < n) return Truncated();
    pos_ += n;
    return absl::OkStatus();
  }
  static absl::Status Truncated() { return absl::DataLossError("encoded update is truncated"); }

 private:
  absl::Span<const uint8_t> b_;
  size_t pos_ = 0;
};

// ---- bit-level writer and reader (LSB first) -----------------------------------------------

class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t>* out) : out_(out) {}
  // n <= 32
  void Put(uint32_t bits, unsigned n) {
    acc_ |= static_cast<uint64_t>(bits & (n == 32 ? 0xffffffffu : ((1u << n) - 1))) << fill_;
    fill_ += n;
    while (fill_ >= 8) {
      out_->push_back(static_cast<uint8_t>(acc_));
      acc_ >>= 8;
      fill_ -= 8;
    }
  }
  void Ones(unsigned n) {
    while (n >= 16) {
      Put(0xffff, 16);
      n -= 16;
    }
    if (n) Put((1u << n) - 1, n);
  }
  // Pads the last byte with zero bits; returns how many (0..7).
  unsigned Flush() {
    const unsigned pad = fill_ ? 8 - fill_ : 0;
    if (fill_) out_->push_back(static_cast<uint8_t>(acc_));
    acc_ = 0;
    fill_ = 0;
    return pad;
  }

 private:
  std::vector<uint8_t>* out_;
  uint64_t acc_ = 0;
  unsigned fill_ = 0;
};

// ---- headers (wire_codec.cc) and segmented containers (wire_segmented.cc) ---------------

// Reads and checks the fixed part of an update, or of a segmented container (up to its
// segment count; h->segments > 0 then).
absl::Status ReadHeader(ByteReader& r, WireHeader* h);
// The rest of a segmented container's fixed part, after its kind byte.
absl::Status ReadSegmentedHeader(ByteReader& r, WireHeader* h);
// The segment table of a container whose header `r` has read (`h`), and each segment's
// header checked against it (SplitSegmented).
absl::Status ReadSegmentTable(ByteReader& r, const WireHeader& h,
                              absl::Span<const uint8_t> bytes, std::vector<SegmentView>* views);
// DecodeAdd of a parsed segmented container whose total length is dst.size(); `touched`
// (DecodeAddTouched: each segment's elements at its offset) may be null.
absl::Status DecodeAddSegments(absl::Span<const SegmentView> segments, float factor,
                               absl::Span<float> dst, std::vector<uint32_t>* touched);

// ---- index streams (wire_indices.cc) ------------------------------------------------------

bool IsKnownKind(uint8_t k);
// Appends the indices of `u` (and its signs when `with_signs`) in the Rice or plain coding.
void PutRiceIndices(const CompressedUpdate& u, bool with_signs, std::vector<uint8_t>* out);
void PutPlainIndices(const CompressedUpdate& u, bool with_signs, std::vector<uint8_t>* out);
// Checks that the index data after `r` can hold `count` elements (see wire_indices.cc).
absl::Status CheckIndexBytes(ByteReader& r, IndexCoding coding, uint32_t length, uint32_t count,
                             bool with_signs, uint64_t trailing_bytes, unsigned* k,
                             unsigned* pad, size_t* stream_bytes);
// Decodes the index stream checked by CheckIndexBytes into idx (and neg).
absl::Status DecodeIndices(ByteReader& r, IndexCoding coding, unsigned k, unsigned pad,
                           size_t stream_bytes, uint32_t length, uint32_t count,
                           bool with_signs, uint32_t* idx, uint8_t* neg);

}  // namespace wire_internal
}  // namespace adaps

#endif  // ADAPS_COMMON_WIRE_INTERNAL_H_
