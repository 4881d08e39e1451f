// The scheduler's tensor layouts: how a declared tensor is split into slices over the
// servers (SplitTensor), and the layout of every tensor declared so far, so that every
// worker declaring it gets the same one.
//
// TensorLayouts is owned by the Scheduler and used only on its I/O thread (the Scheduler
// checks), so it has no lock.
#ifndef ADAPS_SCHEDULER_LAYOUT_H_
#define ADAPS_SCHEDULER_LAYOUT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace adaps {

// One slice of a tensor as the scheduler lays it out.
struct SliceLayout {
  uint64_t offset = 0;
  uint32_t length = 0;
  int server = 0;
};

// Splits a tensor of `length` elements with bin size `bin_size` over servers with current
// loads `load` (bytes; updated). Slice boundaries are multiples of `bin_size`. Exposed for
// tests. kInvalidArgument for a zero length or bin size, or a slice longer than 2^32-1.
absl::StatusOr<std::vector<SliceLayout>> SplitTensor(uint64_t length, uint32_t bin_size,
                                                     uint64_t split_threshold,
                                                     std::vector<uint64_t>& load);

class TensorLayouts {
 public:
  struct Layout {
    uint32_t tensor_id = 0;  // in declaration order
    uint64_t length = 0;
    uint32_t bin_size = 0;
    std::vector<SliceLayout> slices;
  };

  // Tensors of at least `split_threshold` elements are split over all `num_servers`.
  TensorLayouts(int num_servers, uint64_t split_threshold);

  // The layout of tensor `name`: laid out now at its first declaration (`*created` true),
  // else the one it got then. kInvalidArgument for a length or bin size SplitTensor refuses,
  // or other ones than its first declaration's. The pointer stays valid.
  absl::StatusOr<const Layout*> Declare(const std::string& name, uint64_t length,
                                        uint32_t bin_size, bool* created);

 private:
  const uint64_t split_threshold_;
  std::map<std::string, Layout> layouts_;
  std::vector<uint64_t> server_load_;  // bytes laid out on each server
};

}  // namespace adaps

#endif  // ADAPS_SCHEDULER_LAYOUT_H_
