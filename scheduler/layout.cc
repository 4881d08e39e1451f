#include "scheduler/layout.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace adaps {

absl::StatusOr<std::vector<SliceLayout>> SplitTensor(uint64_t length, uint32_t bin_size,
                                                     uint64_t split_threshold,
                                                     std::vector<uint64_t>& load) {
  ADAPS_RET_CHECK(length > 0, absl::StatusCode::kInvalidArgument, "tensor length is zero");
  ADAPS_RET_CHECK(bin_size > 0, absl::StatusCode::kInvalidArgument, "bin size is zero");
  ADAPS_RET_CHECK(!load.empty(), absl::StatusCode::kInvalidArgument, "no servers");
  const uint64_t nbins = (length + bin_size - 1) / bin_size;
  const size_t nservers = load.size();
  std::vector<size_t> order(nservers);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return load[a] < load[b]; });
  const uint64_t parts =
      length >= split_threshold ? std::min<uint64_t>(nservers, nbins) : uint64_t{1};
  std::vector<SliceLayout> slices;
  uint64_t bin = 0;
  for (uint64_t p = 0; p < parts; ++p) {
    // The first (nbins % parts) slices, which go to the least-loaded servers, get a bin more.
    const uint64_t bins = nbins / parts + (p < nbins % parts ? 1 : 0);
    const uint64_t begin = bin * bin_size;
    const uint64_t end = std::min(length, (bin + bins) * bin_size);
    bin += bins;
    ADAPS_RET_CHECK(end - begin <= UINT32_MAX, absl::StatusCode::kInvalidArgument,
                    "slice longer than 2^32-1 elements");
    SliceLayout s;
    s.offset = begin;
    s.length = static_cast<uint32_t>(end - begin);
    s.server = static_cast<int>(order[p]);
    load[order[p]] += uint64_t{s.length} * sizeof(float);
    slices.push_back(s);
  }
  std::sort(slices.begin(), slices.end(),
            [](const SliceLayout& a, const SliceLayout& b) { return a.offset < b.offset; });
  return slices;
}

TensorLayouts::TensorLayouts(int num_servers, uint64_t split_threshold)
    : split_threshold_(split_threshold), server_load_(num_servers, 0) {}

absl::StatusOr<const TensorLayouts::Layout*> TensorLayouts::Declare(const std::string& name,
                                                                     uint64_t length,
                                                                     uint32_t bin_size,
                                                                     bool* created) {
  *created = false;
  auto it = layouts_.find(name);
  if (it == layouts_.end()) {
    auto slices = SplitTensor(length, bin_size, split_threshold_, server_load_);
    if (!slices.ok()) return slices.status();
    Layout layout;
    layout.tensor_id = static_cast<uint32_t>(layouts_.size());
    layout.length = length;
    layout.bin_size = bin_size;
    layout.slices = *std::move(slices);
    it = layouts_.emplace(name, std::move(layout)).first;
    *created = true;
  } else if (it->second.length != length || it->second.bin_size != bin_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' already declared with length ", it->second.length,
        " and bin size ", it->second.bin_size, " (now ", length, ", ", bin_size, ")"));
  }
  return &it->second;
}

}  // namespace adaps
