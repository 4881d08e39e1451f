// The index streams of the wire codec: Rice-coded gaps between ascending indices (with the
// signs packed beside them for AdaComp), or plain 32-bit indices. See common/wire_codec.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_internal.h"

namespace adaps {
namespace wire_internal {

bool IsKnownKind(uint8_t k) { return k <= static_cast<uint8_t>(CompressorKind::kSign); }

// Little-endian store of 8 bytes (the Rice writer's window).
inline void StoreLE64(uint8_t* p, uint64_t w) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  w = __builtin_bswap64(w);
#endif
  std::memcpy(p, &w, 8);
}

namespace {

// Bits of one Rice code of `gap` with parameter k, without the sign bit.
inline uint64_t RiceBits(uint32_t gap, unsigned k) {
  const uint32_t q = gap >> k;
  return q >= kRiceEscape ? kRiceEscape + 32 : q + 1 + k;
}

// Bits of Rice-coding gaps g[0..m) with parameter k (without signs); m <= 2^20.
uint32_t BlockBits(const uint32_t* g, size_t m, unsigned k) {
  uint32_t sum = 0;
  size_t j = 0;
#if defined(__SSE2__)
  // Four gaps at a time: q = g >> k, and an escape where g >> (k + 5) != 0 (q >= 32; a shift
  // of 32 or more gives 0).
  const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(k));
  const __m128i shift_esc = _mm_cvtsi32_si128(static_cast<int>(k + 5));
  const __m128i plain = _mm_set1_epi32(static_cast<int>(k + 1));
  const __m128i escape = _mm_set1_epi32(static_cast<int>(kRiceEscape + 32));
  const __m128i zero = _mm_setzero_si128();
  __m128i acc = zero;
  for (; j + 4 <= m; j += 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g + j));
    const __m128i code = _mm_add_epi32(_mm_srl_epi32(v, shift), plain);
    const __m128i short_code = _mm_cmpeq_epi32(_mm_srl_epi32(v, shift_esc), zero);
    acc = _mm_add_epi32(acc, _mm_or_si128(_mm_and_si128(short_code, code),
                                          _mm_andnot_si128(short_code, escape)));
  }
  alignas(16) uint32_t lanes[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes), acc);
  sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#endif
  for (; j < m; ++j) sum += static_cast<uint32_t>(RiceBits(g[j], k));
  return sum;
}

// The Rice parameter that codes the gaps of `idx` in the fewest bits, among the four around
// log2 of the mean gap (the lowest on a tie), and that many bits (without signs). One pass
// over the indices prices all candidates, a block of gaps at a time.
unsigned ChooseRiceK(const std::vector<uint32_t>& idx, uint32_t length, uint64_t* bits) {
  *bits = 0;
  if (idx.empty()) return 0;
  const double mean_gap = static_cast<double>(length - idx.size()) / static_cast<double>(idx.size());
  const int center = mean_gap > 1.0 ? static_cast<int>(std::log2(mean_gap)) : 0;
  const unsigned lo = static_cast<unsigned>(std::max(0, center - 2));
  const unsigned hi = static_cast<unsigned>(std::min(31, center + 1));
  unsigned k[4];
  for (unsigned t = 0; t < 4; ++t) k[t] = std::min(lo + t, hi);  // repeats of hi never win
  uint64_t cost[4] = {0, 0, 0, 0};
  constexpr size_t kBlock = 1024;
  uint32_t gaps[kBlock];
  uint32_t next = 0;  // the previous index + 1
  for (size_t b = 0; b < idx.size(); b += kBlock) {
    const size_t m = std::min(kBlock, idx.size() - b);
    const uint32_t* in = idx.data() + b;
    gaps[0] = in[0] - next;
    for (size_t j = 1; j < m; ++j) gaps[j] = in[j] - in[j - 1] - 1;
    next = in[m - 1] + 1;
    for (unsigned t = 0; t < 4; ++t) cost[t] += BlockBits(gaps, m, k[t]);
  }
  unsigned best = 0;
  for (unsigned t = 1; t < 4; ++t) {
    if (cost[t] < cost[best]) best = t;
  }
  *bits = cost[best];
  return k[best];
}

// LSB-first bit writer appending to `out` through a 64-bit window: every Put stores the whole
// window and advances by the bytes it completed. The caller sizes `out` for the stream plus
// 8 bytes; a Put that would pass the end grows it (never taken when the size was right).
class WindowWriter {
 public:
  explicit WindowWriter(std::vector<uint8_t>* out, size_t at) : out_(out), at_(at) {}
  // n <= 56; bits < 2^n.
  void Put(uint64_t bits, unsigned n) {
    if (at_ + 8 > out_->size()) out_->resize(2 * out_->size() + 16);
    acc_ |= bits << fill_;
    fill_ += n;
    StoreLE64(out_->data() + at_, acc_);
    at_ += fill_ >> 3;
    acc_ >>= fill_ & ~7u;
    fill_ &= 7;
  }
  // Ends the stream: `out` is cut after its last (partly written) byte; returns the padding
  // bits of that byte.
  unsigned Finish() {
    out_->resize(at_ + (fill_ ? 1 : 0));
    return fill_ ? 8 - fill_ : 0;
  }

 private:
  std::vector<uint8_t>* out_;
  size_t at_;
  uint64_t acc_ = 0;
  unsigned fill_ = 0;
};

}  // namespace

void PutRiceIndices(const CompressedUpdate& u, bool with_signs, std::vector<uint8_t>* out) {
  uint64_t bits = 0;
  const unsigned k = ChooseRiceK(u.indices, u.length, &bits);
  if (with_signs) bits += u.indices.size();
  const size_t k_at = out->size();
  out->resize(k_at + 1 + static_cast<size_t>((bits + 7) / 8) + 8);  // 8: the window past the end
  WindowWriter w(out, k_at + 1);
  const unsigned s = with_signs ? 1 : 0;
  const uint64_t low_mask = (uint64_t{1} << k) - 1;
  uint32_t next = 0;
  for (size_t j = 0; j < u.indices.size(); ++j) {
    const uint32_t i = u.indices[j];
    const uint32_t gap = i - next;
    const uint32_t q = gap >> k;
    const uint64_t sign = with_signs && u.negative[j] ? 1 : 0;
    if (q >= kRiceEscape) {
      w.Put(0xffffffffu, kRiceEscape);  // kRiceEscape ones, then the raw gap
      w.Put(gap, 32);
      if (with_signs) w.Put(sign, 1);
    } else if (q + 1 + k + s <= 56) {
      // q ones, a zero, the low k bits of the gap, the sign: one code word.
      w.Put(((uint64_t{1} << q) - 1) | ((gap & low_mask) << (q + 1)) | (sign << (q + 1 + k)),
            q + 1 + k + s);
    } else {
      w.Put((uint64_t{1} << q) - 1, q);
      w.Put((gap & low_mask) << 1, 1 + k);
      if (with_signs) w.Put(sign, 1);
    }
    next = i + 1;
  }
  const unsigned pad = w.Finish();
  (*out)[k_at] = static_cast<uint8_t>(k | (pad << kRicePadShift));
}

void PutPlainIndices(const CompressedUpdate& u, bool with_signs, std::vector<uint8_t>* out) {
  PutWords<uint32_t>(out, u.indices);
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
    const uint64_t window = br.Peek(bit);
    const uint64_t zeros = ~window;
    const unsigned q = zeros ? static_cast<unsigned>(__builtin_ctzll(zeros)) : 64;
    uint64_t gap;
    uint8_t sign = 0;
    if (q >= kRiceEscape) {
      if (end - bit < uint64_t{kRiceEscape} + 32 + sign_bits) return ByteReader::Truncated();
      bit += kRiceEscape;
      gap = br.Peek(bit) & 0xffffffffu;
      bit += 32;
      if (with_signs) sign = static_cast<uint8_t>(br.Peek(bit) & 1);
    } else {
      const unsigned code = q + 1 + k + sign_bits;
      if (end - bit < code) return ByteReader::Truncated();
      if (k && (q >> (32 - k)) != 0) return absl::DataLossError("Rice gap overflows 32 bits");
      if (code <= 57) {  // the whole code is in the window (Peek's 57 valid bits)
        gap = (uint64_t{q} << k) | ((window >> (q + 1)) & low_mask);
        if (with_signs) sign = static_cast<uint8_t>((window >> (q + 1 + k)) & 1);
      } else {
        gap = (uint64_t{q} << k) | (br.Peek(bit + q + 1) & low_mask);
        if (with_signs) sign = static_cast<uint8_t>(br.Peek(bit + q + 1 + k) & 1);
      }
      bit += q + 1 + k;
    }
    const int64_t i = prev + 1 + static_cast<int64_t>(gap);
    if (i >= static_cast<int64_t>(length)) {
      return absl::DataLossError(absl::StrCat("index ", i, " past the slice length ", length));
    }
    idx[j] = static_cast<uint32_t>(i);
    if (with_signs) {
      neg[j] = sign;
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
