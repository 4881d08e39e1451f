// The wire encoding of one compressed slice update (the payload of a push and of a
// recompressed pull). Layout, all little-endian (also documented in schemas/README.md):
//
//   u8 magic 0xAD | u8 format version (2) | u8 kind | u8 index coding | varint length
//   dense:   length x f32
//   adacomp: varint bin_size | varint count | f32 scale | body
//   topk:    varint count | body, then count x f32 values
//   sign:    f32 positive value | f32 negative value | ceil(length/8) bytes of sign bits
//
// Index coding applies to adacomp and topk bodies:
//   kRice (compact): u8 k | pad << 5 (rice parameter k, and pad = the number of zero bits
//     that fill the stream's last byte, 0..7), then a bit stream (LSB first) with, per element,
//     the gap to the previous index (idx - prev - 1, prev starts at -1) as a Rice code --
//     q = gap >> k in unary as q one-bits and a zero-bit, then the k low bits -- where
//     q >= 32 is written as 32 one-bits followed by the gap in 32 bits; adacomp follows
//     each gap with its sign bit (1 = negative). The stream is padded to a byte; the decoder
//     requires the elements to end exactly at its bit length and the padding to be zero.
//   kPlain32 (baseline): count x u32 indices; adacomp adds ceil(count/8) bytes of sign bits.
//
// A segmented container (a fusion bucket: several tensors' updates in one message, each
// with its own kind, bin size and residue; see docs/architecture.md "Fusion"):
//
//   u8 magic 0xAD | u8 format version (2) | u8 kSegmentedKind | u8 0 | varint total length
//   | varint n | n x (varint length, varint bin size, varint byte count) | the n encodings
//
// Segment i covers the `length` elements after segment i-1 (the first starts at 0); its
// encoding is an ordinary update (not itself segmented) of exactly that length, of any kind;
// an AdaComp one carries the segment's bin size. The lengths sum to the total, the byte
// counts to the rest of the buffer.
//
// Decoding is bounds-checked: a truncated, oversized or corrupt buffer, an index past the
// slice, indices out of order, or another format version returns an error (kDataLoss for
// damage, kInvalidArgument for a mismatched destination) and writes nothing.
#ifndef ADAPS_COMMON_WIRE_CODEC_H_
#define ADAPS_COMMON_WIRE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/compressor.h"

namespace adaps {

inline constexpr uint8_t kWireMagic = 0xAD;
// 2: the Rice parameter byte carries the padding bit count (version 1 did not, so a raised
// count could decode its padding as extra elements).
inline constexpr uint8_t kWireFormatVersion = 2;

enum class IndexCoding : uint8_t {
  kPlain32 = 0,
  kRice = 1,
};

// The kind byte of a segmented container (after the CompressorKind values).
inline constexpr uint8_t kSegmentedKind = 4;

// What the fixed part of an encoded update says, read without decoding the body.
struct WireHeader {
  CompressorKind kind = CompressorKind::kDense;  // dense for a segmented container
  IndexCoding coding = IndexCoding::kRice;
  uint32_t length = 0;
  uint32_t bin_size = 0;  // adacomp only
  uint32_t count = 0;     // adacomp, topk: elements sent; dense, sign: length
  uint32_t segments = 0;  // a segmented container: its number of segments; else 0
};

// One segment of a segmented container: its length and the AdaComp bin size it is
// compressed (and a recompressed pull of it recompressed) with.
struct WireSegment {
  uint32_t length = 0;
  uint32_t bin_size = 0;
  bool operator==(const WireSegment& o) const {
    return length == o.length && bin_size == o.bin_size;
  }
};

// Replaces `*out` with the container of `parts` (each an encoding made by EncodeUpdate or
// EncodeDense) for the segments `table`. kInvalidArgument when the table is empty, a
// segment is empty, a part is not an encoding of its segment's length, or the total exceeds
// 2^32-1; `*out` is left cleared then.
absl::Status EncodeSegmented(absl::Span<const WireSegment> table,
                             absl::Span<const absl::Span<const uint8_t>> parts,
                             std::vector<uint8_t>* out);

// The segment table of a segmented container and where each segment's encoding lies in
// `bytes` (checked: the container's framing only, not the segments' bodies). kDataLoss for
// a damaged container, kInvalidArgument when `bytes` is not a segmented container.
struct SegmentView {
  WireSegment segment;
  absl::Span<const uint8_t> bytes;
};
absl::StatusOr<std::vector<SegmentView>> SplitSegmented(absl::Span<const uint8_t> bytes);

// Replaces `*out` with the encoding of `update`. kInvalidArgument when the update is
// inconsistent (sizes, unsorted or out-of-range indices).
absl::Status EncodeUpdate(const CompressedUpdate& update, IndexCoding coding,
                          std::vector<uint8_t>* out);

// The one encoder of dense wire bytes: the encoding of a dense update of `values` (byte for
// byte what EncodeUpdate writes), straight from the floats in a single copy, with the
// finiteness check fused into that copy. kInvalidArgument when a value is NaN or +-Inf, or
// there are more than 2^32-1 values; `*out` is left cleared then.
absl::Status EncodeDense(absl::Span<const float> values, IndexCoding coding,
                         std::vector<uint8_t>* out);

// Reads and checks the header only.
absl::StatusOr<WireHeader> PeekHeader(absl::Span<const uint8_t> bytes);

// An update parsed once, where it enters (a server's push: Server::OnPush), and handed
// inward so that no decoder reads its header again: the checked header, the bytes (not
// owned: the parse is valid while they are), where the body starts, and a segmented
// container's checked segments (SplitSegmented; empty for a single update).
struct ParsedUpdate {
  WireHeader header;
  absl::Span<const uint8_t> bytes;
  size_t body = 0;  // offset in `bytes` of what follows the header (a container: its table)
  std::vector<SegmentView> segments;

  // Re-points the parse at `moved`, the same bytes elsewhere (a small ZeroMQ message keeps
  // its bytes inside itself, so they move with it). `moved` must hold the same bytes.
  void MoveTo(absl::Span<const uint8_t> moved);
};

// The one parse of an update's header: everything PeekHeader checks, and for a segmented
// container its table and each segment's header as SplitSegmented checks them (the bodies
// are checked by the decoders). kDataLoss for a damaged buffer.
absl::StatusOr<ParsedUpdate> ParseUpdate(absl::Span<const uint8_t> bytes);

// Decodes a whole buffer into `*out` (previous contents replaced). On error `*out` is left
// cleared. A segmented container is kInvalidArgument here (use DecodeAdd or SplitSegmented).
absl::Status DecodeUpdate(absl::Span<const uint8_t> bytes, CompressedUpdate* out);
// The same, for an update parsed already (its header is not read again).
absl::Status DecodeUpdate(const ParsedUpdate& update, CompressedUpdate* out);

// dst += factor * decompress(bytes), without building a dense copy. The whole buffer is
// validated before anything is written, so on any error dst is unchanged. A segmented
// container adds each segment at its offset (all segments validated before any is added).
// kInvalidArgument when dst.size() differs from the encoded length; kDataLoss when the
// buffer is damaged.
absl::Status DecodeAdd(absl::Span<const uint8_t> bytes, float factor, absl::Span<float> dst);
// The same, for an update parsed already (its header is not read again).
absl::Status DecodeAdd(const ParsedUpdate& update, float factor, absl::Span<float> dst);

// DecodeAdd(bytes, factor, dst), and appends to `*touched` the elements the update holds,
// ascending: an AdaComp or Top-k update's indices, every element of a dense or sign one (a
// segmented container's at their segments' offsets). One parse: a server tracking the
// elements a step touched (sparse pulls) takes them from the decode that adds the push. On
// any error neither dst nor `*touched` changes.
absl::Status DecodeAddTouched(absl::Span<const uint8_t> bytes, float factor,
                              absl::Span<float> dst, std::vector<uint32_t>* touched);
absl::Status DecodeAddTouched(const ParsedUpdate& update, float factor, absl::Span<float> dst,
                              std::vector<uint32_t>* touched);

// DecodeAdd(bytes, factor, dst), then copy = dst: a worker's recompressed pull (replica +=
// update, parameters = replica). A single AdaComp update takes one pass over dst: each block
// gets its additions while it is in cache and is copied at once. On any error neither dst
// nor copy changes. kInvalidArgument when copy.size() differs from dst.size().
// For this and the other ...Copy decoders below, `copy` may be `dst` itself (the same
// data: a replica that is the caller's buffer, TensorSpec::pull_in_place): then nothing is
// copied, and a sparse update touches only its elements.
absl::Status DecodeAddCopy(absl::Span<const uint8_t> bytes, float factor, absl::Span<float> dst,
                           absl::Span<float> copy);

// A sparse pull answer (schemas/README.md "Sparse pulls"): a Top-k encoding whose values
// replace dst's at their indices (the other elements kept, or set to 0 when `zero_rest`),
// then copy = dst. The whole buffer is validated first: on any error neither dst nor copy
// changes. kInvalidArgument when the sizes differ or the encoding is not a Top-k one (or is
// segmented); kDataLoss when the buffer is damaged.
absl::Status DecodeAssignCopy(absl::Span<const uint8_t> bytes, bool zero_rest,
                              absl::Span<float> dst, absl::Span<float> copy);

// A forwarded pull answer (schemas/README.md "Sparse pulls"): the pushes of one step of a
// mean server, as the server received them, and the scale it applied (1 / pushes), so a
// worker replays the server's arithmetic exactly: dst = 0, dst += each push in order
// (DecodeAdd, factor 1), dst *= scale; then copy = dst. Layout: u32 magic "AFW1" | u32
// count | f32 scale | count x (u32 size | that many bytes of a push payload), where one
// push may be the puller's own, left out: size 0xFFFFFFFF and no bytes (the puller holds it).
// ForwardedSize: the bytes EncodeForwarded writes for pushes of these sizes (none left out).
size_t ForwardedSize(absl::Span<const size_t> push_sizes);
// `own`: the index of the push to leave out (-1: none). kInvalidArgument for no pushes, a
// push over 4 GiB - 2 bytes or a scale that is not finite and > 0.
absl::Status EncodeForwarded(float scale, absl::Span<const absl::Span<const uint8_t>> pushes,
                             std::vector<uint8_t>* out, int own = -1);
// `own`: the puller's own push (null: it holds none), replayed where the answer left it out.
// Every push is validated (for dst.size() elements) before anything is written: on any
// error neither dst nor copy changes. kInvalidArgument when copy.size() differs from
// dst.size(); kDataLoss when the buffer is damaged, a push is for another length, or the
// answer leaves out a push the puller does not hold (or leaves out two).
absl::Status DecodeForwardedCopy(absl::Span<const uint8_t> bytes, absl::Span<float> dst,
                                 absl::Span<float> copy,
                                 const absl::Span<const uint8_t>* own = nullptr);

// A push decoded once: one part, or a segmented push's segments, each at its offset in the
// slice (the buffers are reused from call to call).
struct DecodedPart {
  uint32_t offset = 0;
  CompressedUpdate update;
};
// Decodes (so checks) `bytes`, a push of `length` elements as DecodeAdd accepts it, into
// parts[*used, ...) (parts grows as needed; *used advances). `*sparse` becomes false for a
// dense or sign part (every element). kDataLoss / the codec's error otherwise, and then
// *used is where it was.
absl::Status DecodePushParts(absl::Span<const uint8_t> bytes, size_t length,
                             std::vector<DecodedPart>& parts, size_t* used, bool* sparse);
absl::Status DecodePushParts(const ParsedUpdate& update, size_t length,
                             std::vector<DecodedPart>& parts, size_t* used, bool* sparse);
// The servers' tracked SGD step (no weight decay) over the step's pushes, decoded, in the
// order the server took them: for each part in order, at each element it carries,
// SgdStep(lr, 0, value * scale, p[element]), value the one DecodeAdd adds (factor 1). One
// push at a time: no sum of the slice's size. Blocked over p (each block gets every part's
// steps while it is in cache), the lines of the elements ahead requested. The parts must
// lie within p (DecodePushParts for p.size() elements). `copy` (p.size() elements, or null,
// or p itself: nothing copied): each block copied there once stepped.
void ApplySgdParts(absl::Span<const DecodedPart> parts, float scale, float lr,
                   absl::Span<float> p, float* copy = nullptr);

// A forwarded SGD step (schemas/README.md "Sparse pulls"): a tracked step of servers running
// SGD without weight decay, ApplySgdParts over the pushes in order. Layout: u32 magic "AFS2" |
// u32 count | f32 scale | f32 lr | the pushes as in "AFW1". kInvalidArgument as
// EncodeForwarded, and for a rate that is not finite and >= 0.
absl::Status EncodeForwardedSgd(float scale, float lr,
                                absl::Span<const absl::Span<const uint8_t>> pushes,
                                std::vector<uint8_t>* out, int own = -1);
// The replay of a forwarded SGD step on `dst`, the replica at the version before the step:
// the server's float operations (ApplySgdParts, as the server's step) so the same bits; then
// copy = dst. Errors as DecodeForwardedCopy (a mean step's answer is
// kDataLoss here, and an SGD step's there); on any error neither dst nor copy changes.
absl::Status DecodeForwardedSgdCopy(absl::Span<const uint8_t> bytes, absl::Span<float> dst,
                                    absl::Span<float> copy,
                                    const absl::Span<const uint8_t>* own = nullptr);

// Size of the encoding in bits divided by the number of elements sent (count). Infinity
// when nothing is sent.
double BitsPerSentElement(const CompressedUpdate& update, size_t encoded_bytes);

}  // namespace adaps

#endif  // ADAPS_COMMON_WIRE_CODEC_H_
