// Loops over scattered elements of large float arrays (a sparse update's indices: a few
// percent of a slice, ascending, each element on its own cache line, at gaps the hardware
// prefetchers do not follow), requesting the lines of the element kScatterAhead further on in
// every array the loop writes: without it the loop is a chain of cache misses. Used by the
// codec's decode-adds and assigns (common/wire_codec.cc) and the servers' sparse optimizer
// step (common/optimizer.cc).
#ifndef ADAPS_COMMON_SCATTER_H_
#define ADAPS_COMMON_SCATTER_H_

#include <cstddef>
#include <cstdint>

namespace adaps {

// 32 rather than 16: the forwarded SGD replay of four pushes over 25M floats 24.4 -> 22.4-23.9
// ms, the decode-adds the same or 5% faster (docs/benchmarks.md "Pulls in place").
inline constexpr size_t kScatterAhead = 32;

// Calls f(j) for j in [0, n), in order; `arrays` are indexed by at[j].
template <typename F, typename... Arrays>
inline void ForEachScattered(const uint32_t* at, size_t n, F f, Arrays*... arrays) {
  size_t j = 0;
  for (; j + kScatterAhead < n; ++j) {
    (__builtin_prefetch(arrays + at[j + kScatterAhead], 1), ...);
    f(j);
  }
  for (; j < n; ++j) f(j);
}

}  // namespace adaps

#endif  // ADAPS_COMMON_SCATTER_H_
