#include "worker/residue_file.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"

namespace adaps {
namespace {

constexpr char kResidueMagic[8] = {'A', 'D', 'A', 'P', 'S', 'R', 'S', '1'};

}  // namespace

std::vector<uint8_t> EncodeResidues(const std::vector<TensorResidue>& tensors) {
  RecordWriter w;
  w.Put(kResidueMagic);
  w.Put<uint64_t>(tensors.size());
  for (const TensorResidue& t : tensors) {
    w.PutString(t.name);
    w.PutFloats(t.residue);
  }
  w.Put<uint32_t>(Crc32(w.bytes));
  return std::move(w.bytes);
}

absl::StatusOr<std::vector<TensorResidue>> DecodeResidues(absl::Span<const uint8_t> bytes,
                                                          const std::string& path) {
  auto damaged = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("residue file ", path, " is damaged: ", why));
  };
  if (bytes.size() < sizeof(kResidueMagic) + 12 ||
      std::memcmp(bytes.data(), kResidueMagic, sizeof(kResidueMagic)) != 0) {
    return damaged("not an adaps residue file (bad magic or too short)");
  }
  uint32_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 4, 4);
  if (Crc32(bytes.subspan(0, bytes.size() - 4)) != stored) return damaged("checksum mismatch");
  RecordReader r(bytes.subspan(sizeof(kResidueMagic), bytes.size() - sizeof(kResidueMagic) - 4));
  uint64_t count;
  if (!r.Get(&count)) return damaged("truncated");
  std::vector<TensorResidue> out;
  for (uint64_t i = 0; i < count; ++i) {
    TensorResidue t;
    if (!r.GetString(&t.name) || !r.GetFloats(&t.residue, bytes.size() / sizeof(float))) {
      return damaged("truncated tensor record");
    }
    out.push_back(std::move(t));
  }
  if (!r.AtEnd()) return damaged("trailing bytes");
  return out;
}

}  // namespace adaps
