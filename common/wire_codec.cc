#include "common/wire_codec.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace adaps {
namespace {

constexpr uint32_t kRiceEscape = 32;  // unary prefix of this many ones: raw 32-bit gap follows
// The Rice parameter byte: k in the low 5 bits, the number of padding bits of the stream's
// last byte (0..7) in the high 3, so the stream's exact bit length is known (format 2).
constexpr unsigned kRicePadShift = 5;
constexpr uint8_t kRiceKMask = 0x1f;

// ---- byte-level writer and reader -------------------------------------------------------

void PutU8(std::vector<uint8_t>* out, uint8_t v) { out->push_back(v); }

void PutVarint(std::vector<uint8_t>* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<uint8_t>(v));
}

void PutU32(std::vector<uint8_t>* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void PutF32(std::vector<uint8_t>* out, float f) {
  uint32_t v;
  std::memcpy(&v, &f, 4);
  PutU32(out, v);
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

absl::Status ReadHeader(ByteReader& r, WireHeader* h) {
  uint8_t magic = 0, version = 0, kind = 0, coding = 0;
  ADAPS_RETURN_IF_ERROR(r.U8(&magic));
  if (magic != kWireMagic) return absl::DataLossError("not an adaps update (bad magic byte)");
  ADAPS_RETURN_IF_ERROR(r.U8(&version));
  if (version != kWireFormatVersion) {
    return absl::DataLossError(absl::StrCat("update format version ", version,
                                            " is not supported (this build reads version ",
                                            kWireFormatVersion, ")"));
  }
  ADAPS_RETURN_IF_ERROR(r.U8(&kind));
  if (!IsKnownKind(kind)) return absl::DataLossError(absl::StrCat("unknown update kind ", kind));
  ADAPS_RETURN_IF_ERROR(r.U8(&coding));
  if (coding > static_cast<uint8_t>(IndexCoding::kRice)) {
    return absl::DataLossError(absl::StrCat("unknown index coding ", coding));
  }
  h->kind = static_cast<CompressorKind>(kind);
  h->coding = static_cast<IndexCoding>(coding);
  ADAPS_RETURN_IF_ERROR(r.Varint32(&h->length));
  h->bin_size = 0;
  h->count = h->length;
  if (h->kind == CompressorKind::kAdaComp) {
    ADAPS_RETURN_IF_ERROR(r.Varint32(&h->bin_size));
    if (h->bin_size == 0) return absl::DataLossError("AdaComp bin size 0");
  }
  if (h->kind == CompressorKind::kAdaComp || h->kind == CompressorKind::kTopK) {
    ADAPS_RETURN_IF_ERROR(r.Varint32(&h->count));
    if (h->count > h->length) {
      return absl::DataLossError(absl::StrCat("count ", h->count, " exceeds length ", h->length));
    }
  }
  return absl::OkStatus();
}

float LoadF32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

absl::Status NonFinite(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("update carries a NaN or Inf ", what));
}

// Everything an encoded update says, fully validated (including the exact end of the
// buffer); the indices and signs are decoded into the caller's vectors (one decoding pass),
// the bulk float data is pointed to in `bytes`.
struct Parsed {
  WireHeader h;
  float scale = 0.0f;      // adacomp; sign: positive value
  float scale_neg = 0.0f;  // sign: negative value
  const uint8_t* floats = nullptr;  // dense: length values; topk: count values
  const uint8_t* bits = nullptr;    // sign: ceil(length / 8) bytes
};

absl::Status Parse(absl::Span<const uint8_t> bytes, Parsed* p, std::vector<uint32_t>* idx,
                   std::vector<uint8_t>* neg) {
  ByteReader r(bytes);
  WireHeader* h = &p->h;
  ADAPS_RETURN_IF_ERROR(ReadHeader(r, h));
  switch (h->kind) {
    case CompressorKind::kDense: {
      const uint64_t n = uint64_t{4} * h->length;
      if (r.remaining() < n) return ByteReader::Truncated();
      p->floats = r.here();
      for (uint32_t i = 0; i < h->length; ++i) {
        if (!std::isfinite(LoadF32(p->floats + 4 * i))) return NonFinite("value");
      }
      ADAPS_RETURN_IF_ERROR(r.Skip(n));
      break;
    }
    case CompressorKind::kAdaComp:
    case CompressorKind::kTopK: {
      const bool ternary = h->kind == CompressorKind::kAdaComp;
      if (ternary) {
        ADAPS_RETURN_IF_ERROR(r.F32(&p->scale));
        if (!std::isfinite(p->scale)) return NonFinite("scale");
      }
      unsigned k = 0, pad = 0;
      size_t stream_bytes = 0;
      const uint64_t value_bytes = ternary ? 0 : uint64_t{4} * h->count;
      ADAPS_RETURN_IF_ERROR(CheckIndexBytes(r, h->coding, h->length, h->count, ternary,
                                            value_bytes, &k, &pad, &stream_bytes));
      // Sized only now: the data has been shown to hold `count` elements.
      idx->resize(h->count);
      neg->resize(ternary ? h->count : 0);
      ADAPS_RETURN_IF_ERROR(DecodeIndices(r, h->coding, k, pad, stream_bytes, h->length,
                                          h->count, ternary, idx->data(), neg->data()));
      if (!ternary) {
        const uint64_t vbytes = uint64_t{4} * h->count;
        if (r.remaining() < vbytes) return ByteReader::Truncated();
        p->floats = r.here();
        for (uint32_t j = 0; j < h->count; ++j) {
          if (!std::isfinite(LoadF32(p->floats + 4 * j))) return NonFinite("value");
        }
        ADAPS_RETURN_IF_ERROR(r.Skip(vbytes));
      }
      break;
    }
    case CompressorKind::kSign: {
      ADAPS_RETURN_IF_ERROR(r.F32(&p->scale));
      ADAPS_RETURN_IF_ERROR(r.F32(&p->scale_neg));
      if (!std::isfinite(p->scale) || !std::isfinite(p->scale_neg)) return NonFinite("scale");
      const uint64_t nbytes = (uint64_t{h->length} + 7) / 8;
      if (r.remaining() < nbytes) return ByteReader::Truncated();
      p->bits = r.here();
      if ((h->length % 8) && (p->bits[h->length / 8] >> (h->length % 8)) != 0) {
        return absl::DataLossError("nonzero padding after sign bits");
      }
      ADAPS_RETURN_IF_ERROR(r.Skip(nbytes));
      break;
    }
  }
  if (r.remaining() != 0) {
    return absl::DataLossError(absl::StrCat(r.remaining(), " unexpected bytes after the update"));
  }
  return absl::OkStatus();
}

void PutHeader(CompressorKind kind, IndexCoding coding, uint64_t length,
               std::vector<uint8_t>* out) {
  PutU8(out, kWireMagic);
  PutU8(out, kWireFormatVersion);
  PutU8(out, static_cast<uint8_t>(kind));
  PutU8(out, static_cast<uint8_t>(coding));
  PutVarint(out, length);
}

// Appends the floats of a dense body in one copy. With `check_finite`, the same pass ORs
// together whether any value's exponent is all ones (NaN or +-Inf) and returns false then.
bool PutDenseBody(absl::Span<const float> values, bool check_finite, std::vector<uint8_t>* out) {
  const size_t at = out->size();
  const size_t n = values.size();
  out->resize(at + 4 * n);
  // memcpy from the null data() of an empty span is undefined, even for 0 bytes.
  if (n == 0) return true;
  uint8_t* dst = out->data() + at;
  if (!check_finite) {
    std::memcpy(dst, values.data(), 4 * n);
    return true;
  }
  const float* src = values.data();
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + i, 4);
    std::memcpy(dst + 4 * i, &bits, 4);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace

absl::Status EncodeDense(absl::Span<const float> values, IndexCoding coding,
                         std::vector<uint8_t>* out) {
  out->clear();
  if (values.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense update of ", values.size(), " elements is longer than 2^32-1"));
  }
  out->reserve(16 + 4 * values.size());
  PutHeader(CompressorKind::kDense, coding, values.size(), out);
  if (!PutDenseBody(values, /*check_finite=*/true, out)) {
    out->clear();
    return absl::InvalidArgumentError("dense values hold NaN or Inf");
  }
  return absl::OkStatus();
}

absl::Status EncodeUpdate(const CompressedUpdate& u, IndexCoding coding,
                          std::vector<uint8_t>* out) {
  out->clear();
  ADAPS_RETURN_IF_ERROR(ValidateUpdate(u));
  if (u.kind == CompressorKind::kAdaComp && u.bin_size == 0) {
    return absl::InvalidArgumentError("AdaComp bin size 0");
  }
  PutHeader(u.kind, coding, u.length, out);
  switch (u.kind) {
    case CompressorKind::kDense:
      PutDenseBody(u.values, /*check_finite=*/false, out);
      break;
    case CompressorKind::kAdaComp:
      PutVarint(out, u.bin_size);
      PutVarint(out, u.indices.size());
      PutF32(out, u.scale);
      if (coding == IndexCoding::kRice) {
        PutRiceIndices(u, true, out);
      } else {
        PutPlainIndices(u, true, out);
      }
      break;
    case CompressorKind::kTopK:
      PutVarint(out, u.indices.size());
      if (coding == IndexCoding::kRice) {
        PutRiceIndices(u, false, out);
      } else {
        PutPlainIndices(u, false, out);
      }
      for (float v : u.values) PutF32(out, v);
      break;
    case CompressorKind::kSign: {
      PutF32(out, u.scale);
      PutF32(out, u.scale_neg);
      const size_t nbytes = (static_cast<size_t>(u.length) + 7) / 8;
      for (size_t b = 0; b < nbytes; ++b) {
        out->push_back(static_cast<uint8_t>(u.sign_bits[b / 8] >> (8 * (b % 8))));
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<WireHeader> PeekHeader(absl::Span<const uint8_t> bytes) {
  ByteReader r(bytes);
  WireHeader h;
  ADAPS_RETURN_IF_ERROR(ReadHeader(r, &h));
  return h;
}

absl::Status DecodeUpdate(absl::Span<const uint8_t> bytes, CompressedUpdate* out) {
  out->Clear();
  Parsed p;
  absl::Status st = Parse(bytes, &p, &out->indices, &out->negative);
  if (!st.ok()) {
    out->Clear();
    return st;
  }
  const WireHeader& h = p.h;
  out->kind = h.kind;
  out->length = h.length;
  out->bin_size = h.bin_size;
  switch (h.kind) {
    case CompressorKind::kDense:
      out->values.resize(h.length);
      if (h.length != 0) {
        std::memcpy(out->values.data(), p.floats, 4 * static_cast<size_t>(h.length));
      }
      break;
    case CompressorKind::kAdaComp:
      out->scale = p.scale;
      break;
    case CompressorKind::kTopK:
      out->values.resize(h.count);
      if (h.count != 0) {
        std::memcpy(out->values.data(), p.floats, 4 * static_cast<size_t>(h.count));
      }
      break;
    case CompressorKind::kSign: {
      out->scale = p.scale;
      out->scale_neg = p.scale_neg;
      out->sign_bits.assign((static_cast<size_t>(h.length) + 63) / 64, 0);
      for (size_t b = 0; b < (static_cast<size_t>(h.length) + 7) / 8; ++b) {
        out->sign_bits[b / 8] |= static_cast<uint64_t>(p.bits[b]) << (8 * (b % 8));
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeAdd(absl::Span<const uint8_t> bytes, float factor, absl::Span<float> dst) {
  ADAPS_ASSIGN_OR_RETURN(WireHeader head, PeekHeader(bytes));
  if (head.length != dst.size()) {
    return absl::InvalidArgumentError(absl::StrCat("update is for ", head.length,
                                                   " elements, buffer has ", dst.size()));
  }
  // Validate and decode once, into per-thread scratch (kept between calls, so a server adding
  // push after push allocates nothing); only a fully valid buffer is then applied.
  thread_local std::vector<uint32_t> idx;
  thread_local std::vector<uint8_t> neg;
  Parsed p;
  ADAPS_RETURN_IF_ERROR(Parse(bytes, &p, &idx, &neg));
  const WireHeader& h = p.h;
  float* d = dst.data();
  switch (h.kind) {
    case CompressorKind::kDense:
      for (uint32_t i = 0; i < h.length; ++i) d[i] += factor * LoadF32(p.floats + 4 * i);
      break;
    case CompressorKind::kAdaComp: {
      const float pos = factor * p.scale;
      const uint32_t* ix = idx.data();
      const uint8_t* ng = neg.data();
      for (uint32_t j = 0; j < h.count; ++j) d[ix[j]] += ng[j] ? -pos : pos;
      break;
    }
    case CompressorKind::kTopK:
      for (uint32_t j = 0; j < h.count; ++j) d[idx[j]] += factor * LoadF32(p.floats + 4 * j);
      break;
    case CompressorKind::kSign: {
      const float a = factor * p.scale, b = factor * p.scale_neg;
      for (uint32_t i = 0; i < h.length; ++i) d[i] += ((p.bits[i / 8] >> (i % 8)) & 1) ? b : a;
      break;
    }
  }
  return absl::OkStatus();
}

double BitsPerSentElement(const CompressedUpdate& update, size_t encoded_bytes) {
  const size_t sent = update.SentElements();
  if (sent == 0) return std::numeric_limits<double>::infinity();
  return 8.0 * static_cast<double>(encoded_bytes) / static_cast<double>(sent);
}

}  // namespace adaps
