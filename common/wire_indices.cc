// The index streams of the wire codec: Rice-coded gaps between ascending indices (with the
// signs packed beside them for AdaComp), or plain 32-bit indices. See common/wire_codec.h.
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_internal.h"

namespace adaps {
namespace wire_internal {

bool IsKnownKind(uint8_t k) { return k <= static_cast<uint8_t>(CompressorKind::kSign); }

// Total bits of Rice-coding the gaps of `idx` with parameter k.
uint64_t RiceCost(const std::vector<uint32_t>& idx, unsigned k) {
  uint64_t bits = 0;
  int64_t prev = -1;
  for (uint32_t i : idx) {
    const uint32_t gap = static_cast<uint32_t>(static_cast<int64_t>(i) - prev - 1);
    const uint32_t q = gap >> k;
    bits += q >= kRiceEscape ? kRiceEscape + 32 : q + 1 + k;
    prev = i;
  }
  return bits;
}

unsigned ChooseRiceK(const std::vector<uint32_t>& idx, uint32_t length) {
  if (idx.empty()) return 0;
  const double mean_gap = static_cast<double>(length - idx.size()) / static_cast<double>(idx.size());
  int center = mean_gap > 1.0 ? static_cast<int>(std::log2(mean_gap)) : 0;
  unsigned best_k = 0;
  uint64_t best = std::numeric_limits<uint64_t>::max();
  for (int k = std::max(0, center - 2); k <= std::min(31, center + 1); ++k) {
    const uint64_t c = RiceCost(idx, static_cast<unsigned>(k));
    if (c < best) {
      best = c;
      best_k = static_cast<unsigned>(k);
    }
  }
  return best_k;
}

void PutRiceIndices(const CompressedUpdate& u, bool with_signs, std::vector<uint8_t>* out) {
  const unsigned k = ChooseRiceK(u.indices, u.length);
  const size_t k_at = out->size();
  PutU8(out, static_cast<uint8_t>(k));
  BitWriter w(out);
  int64_t prev = -1;
  for (size_t j = 0; j < u.indices.size(); ++j) {
    const uint32_t i = u.indices[j];
    const uint32_t gap = static_cast<uint32_t>(static_cast<int64_t>(i) - prev - 1);
    const uint32_t q = gap >> k;
    if (q >= kRiceEscape) {
      w.Ones(kRiceEscape);
      w.Put(gap, 32);
    } else {
      w.Ones(q);
      w.Put(0, 1);
      if (k) w.Put(gap, k);
    }
    if (with_signs) w.Put(u.negative[j] ? 1 : 0, 1);
    prev = i;
  }
  (*out)[k_at] |= static_cast<uint8_t>(w.Flush() << kRicePadShift);
}

void PutPlainIndices(const CompressedUpdate& u, bool with_signs, std::vector<uint8_t>* out) {
  for (uint32_t i : u.indices) PutU32(out, i);
  if (with_signs) {
    BitWriter w(out);
    for (uint8_t neg : u.negative) w.Put(neg ? 1 : 0, 1);
    w.Flush();
  }
}

// ---- index decoding ------------------------------------------------------------------------

// Little-endian load of up to 8 bytes at data[byte..nbytes), bytes past the end read as 0.
inline uint64_t LoadLE64(const uint8_t* data, size_t byte, size_t nbytes) {
  uint64_t w = 0;
  if (byte + 8 <= nbytes) {
    std::memcpy(&w, data + byte, 8);
  } else if (byte < nbytes) {
    std::memcpy(&w, data + byte, nbytes - byte);
  }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  w = __builtin_bswap64(w);
#endif
  return w;
}

// The Rice bit stream (LSB first) read through a 64-bit window: Peek(bit) returns the stream
// from bit `bit` on, at least 57 valid bits, zeros past the end of the data. Every read is
// checked against the real end (`bits`) before it is used.
class RiceReader {
 public:
  // `nbytes` bytes of which the last `pad` bits are padding: the stream is nbytes * 8 - pad
  // bits long (pad <= 7, and 0 when nbytes is 0: checked by the caller).
  RiceReader(const uint8_t* data, size_t nbytes, unsigned pad)
      : data_(data), nbytes_(nbytes), bits_(uint64_t{nbytes} * 8 - pad) {}
  uint64_t Peek(uint64_t bit) const { return LoadLE64(data_, bit >> 3, nbytes_) >> (bit & 7); }
  uint64_t bits() const { return bits_; }
  // The padding bits after the stream's end must be zero.
  bool PaddingOk() const {
    if ((bits_ & 7) == 0) return true;
    return (data_[bits_ >> 3] >> (bits_ & 7)) == 0;
  }

 private:
  const uint8_t* data_;
  size_t nbytes_;
  uint64_t bits_;
};

// Reads the Rice parameter byte and checks that the data can hold `count` elements; for
// Rice sets *k, *pad and *stream_bytes (the index stream's extent: the rest of the buffer
// less `trailing_bytes`, the Top-k values that follow it).
absl::Status CheckIndexBytes(ByteReader& r, IndexCoding coding, uint32_t length, uint32_t count,
                             bool with_signs, uint64_t trailing_bytes, unsigned* k,
                             unsigned* pad, size_t* stream_bytes) {
  if (count > length) {
    return absl::DataLossError(absl::StrCat("count ", count, " exceeds slice length ", length));
  }
  if (coding == IndexCoding::kPlain32) {
    const uint64_t need = uint64_t{4} * count + (with_signs ? (uint64_t{count} + 7) / 8 : 0);
    if (r.remaining() < need) return ByteReader::Truncated();
    return absl::OkStatus();
  }
  uint8_t k8 = 0;
  ADAPS_RETURN_IF_ERROR(r.U8(&k8));
  *k = k8 & kRiceKMask;
  *pad = k8 >> kRicePadShift;
  if (r.remaining() < trailing_bytes) return ByteReader::Truncated();
  *stream_bytes = r.remaining() - static_cast<size_t>(trailing_bytes);
  if (*stream_bytes == 0 && *pad != 0) {
    return absl::DataLossError("padding bits claimed for an empty index stream");
  }
  // Each element takes at least k + 1 (+1 sign) bits: reject counts the data cannot hold.
  const uint64_t min_bits = uint64_t{count} * (*k + 1 + (with_signs ? 1 : 0));
  if (min_bits > uint64_t{*stream_bytes} * 8 - *pad) return ByteReader::Truncated();
  return absl::OkStatus();
}

// Decodes `count` indices (and, with_signs, their sign bits) into idx[0..count) and
// neg[0..count), validating every index (in range, ascending), the padding and the exact bit
// extent; `r` is advanced past the index data. The caller sizes idx and neg to `count` only
// after CheckIndexBytes() has shown that the data can hold that many elements.
absl::Status DecodeIndices(ByteReader& r, IndexCoding coding, unsigned k, unsigned pad,
                           size_t stream_bytes, uint32_t length, uint32_t count,
                           bool with_signs, uint32_t* idx, uint8_t* neg) {
  int64_t prev = -1;
  if (coding == IndexCoding::kPlain32) {
    const uint64_t idx_bytes = uint64_t{4} * count;
    const uint64_t sign_bytes = with_signs ? (uint64_t{count} + 7) / 8 : 0;
    const uint8_t* p = r.here();
    const uint8_t* s = p + idx_bytes;
    for (uint32_t j = 0; j < count; ++j) {
      uint32_t i = 0;
      for (int b = 0; b < 4; ++b) i |= static_cast<uint32_t>(p[4 * j + b]) << (8 * b);
      if (static_cast<int64_t>(i) <= prev || i >= length) {
        return absl::DataLossError(absl::StrCat("index ", i, " out of order or past ", length));
      }
      idx[j] = i;
      if (with_signs) neg[j] = (s[j / 8] >> (j % 8)) & 1;
      prev = i;
    }
    if (with_signs && (count % 8) && (s[count / 8] >> (count % 8)) != 0) {
      return absl::DataLossError("nonzero padding after sign bits");
    }
    return r.Skip(idx_bytes + sign_bytes);
  }
  const RiceReader br(r.here(), stream_bytes, pad);
  const uint64_t end = br.bits();
  const unsigned sign_bits = with_signs ? 1 : 0;
  const uint64_t low_mask = (uint64_t{1} << k) - 1;
  uint64_t bit = 0;
  for (uint32_t j = 0; j < count; ++j) {
    // Unary part: the run of one-bits, counted at once (a window of only ones -- 64 or more in
    // a row -- is an escape; ctz of 0 is undefined). Zeros read past the end stop the run
    // early, and the extent check below then finds the stream truncated.
    const uint64_t zeros = ~br.Peek(bit);
    const unsigned q = zeros ? static_cast<unsigned>(__builtin_ctzll(zeros)) : 64;
    uint64_t gap;
    if (q >= kRiceEscape) {
      if (end - bit < uint64_t{kRiceEscape} + 32 + sign_bits) return ByteReader::Truncated();
      bit += kRiceEscape;
      gap = br.Peek(bit) & 0xffffffffu;
      bit += 32;
    } else {
      if (end - bit < uint64_t{q} + 1 + k + sign_bits) return ByteReader::Truncated();
      if (k && (q >> (32 - k)) != 0) return absl::DataLossError("Rice gap overflows 32 bits");
      bit += q + 1;
      gap = (uint64_t{q} << k) | (br.Peek(bit) & low_mask);
      bit += k;
    }
    const int64_t i = prev + 1 + static_cast<int64_t>(gap);
    if (i >= static_cast<int64_t>(length)) {
      return absl::DataLossError(absl::StrCat("index ", i, " past the slice length ", length));
    }
    idx[j] = static_cast<uint32_t>(i);
    if (with_signs) {
      neg[j] = static_cast<uint8_t>(br.Peek(bit) & 1);
      ++bit;
    }
    prev = i;
  }
  // The stream's bit length is known: elements decoded from padding (a raised count) or
  // left over (a lowered one) both show here.
  if (bit != end) {
    return absl::DataLossError(absl::StrCat("index stream of ", end, " bits holds ", bit,
                                            " bits of ", count, " elements"));
  }
  if (!br.PaddingOk()) return absl::DataLossError("nonzero padding after the index stream");
  return r.Skip(stream_bytes);
}

}  // namespace wire_internal
}  // namespace adaps
