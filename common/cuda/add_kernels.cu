// Decompress-and-add kernels (AdaComp, dense, Top-k, sign) and the dense baseline's finiteness
// check, with their launchers. The AdaComp pass is in adacomp_kernels.cu.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/adacomp_kernels.h"

namespace adaps {
namespace cuda {
namespace kernels {
namespace {

__device__ __forceinline__ bool IsNonFinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}


__global__ void CheckFiniteKernel(const float* g, size_t n, Header* header) {
  const size_t misalign = (reinterpret_cast<uintptr_t>(g) & 15u) / 4u;
  size_t head = misalign == 0 ? 0 : 4 - misalign;
  if (head > n) head = n;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  bool bad = false;
  if (tid < head) bad = IsNonFinite(g[tid]);
  const float4* g4 = reinterpret_cast<const float4*>(g + head);
  const size_t n4 = (n - head) / 4;
#pragma unroll 4
  for (size_t i = tid; i < n4; i += stride) {
    const float4 x = g4[i];
    bad |= IsNonFinite(x.x) | IsNonFinite(x.y) | IsNonFinite(x.z) | IsNonFinite(x.w);
  }
  for (size_t i = head + n4 * 4 + tid; i < n; i += stride) bad |= IsNonFinite(g[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(&header->nonfinite, 1u);
}

__global__ void AdaCompAddKernel(const uint32_t* idx, const uint8_t* neg, uint32_t count,
                                 float scale, const Header* header, float factor, float* dst) {
  if (header != nullptr) {
    if (header->ok == 0u) return;  // a failed step (NaN/Inf gradient, overflow) adds nothing
    count = header->count;
    scale = header->scale;
  }
  const float pos = __fmul_rn(factor, scale);
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < count;
       j += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t i = idx[j];
    dst[i] = __fadd_rn(dst[i], neg[j] ? -pos : pos);
  }
}

__global__ void DenseAddKernel(const float* values, size_t n, const Header* header, float factor,
                               float* dst) {
  if (header != nullptr && header->nonfinite != 0u) return;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __fadd_rn(dst[i], __fmul_rn(factor, values[i]));
  }
}

__global__ void SparseAddKernel(const uint32_t* idx, const float* values, size_t count,
                                float factor, float* dst) {
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < count;
       j += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[idx[j]] = __fadd_rn(dst[idx[j]], __fmul_rn(factor, values[j]));
  }
}

__global__ void SignAddKernel(const uint64_t* sign_bits, size_t n, float scale, float scale_neg,
                              float factor, float* dst) {
  const float pos = __fmul_rn(factor, scale), negv = __fmul_rn(factor, scale_neg);
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __fadd_rn(dst[i], ((sign_bits[i / 64] >> (i % 64)) & 1u) ? negv : pos);
  }
}

unsigned GridFor(size_t work, int sm_count, int per_sm) {
  const size_t blocks = (work + kBlock - 1) / kBlock;
  const size_t cap = static_cast<size_t>(sm_count > 0 ? sm_count : 1) * per_sm;
  return static_cast<unsigned>(blocks < cap ? (blocks == 0 ? 1 : blocks) : cap);
}

// Whole bins per tile for bin size t <= cap, preferring tiles that start on a 32-byte sector
// unless that wastes over 1/8 of the tile (the original 8-row choice).
}  // namespace

int MultiProcessorCount() {
  int dev = 0, count = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  return count;
}

cudaError_t ProbeKernelImage() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, CheckFiniteKernel);
}

cudaError_t LaunchCheckFinite(const float* grad, size_t n, Header* header, int sm_count,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CheckFiniteKernel<<<GridFor((n + 3) / 4, sm_count, 8), kBlock, 0, stream>>>(grad, n, header);
  return cudaGetLastError();
}

cudaError_t LaunchAdaCompAdd(const uint32_t* indices, const uint8_t* negative, uint32_t count,
                             float scale, const Header* header, float factor, float* dst,
                             int sm_count, cudaStream_t stream) {
  const unsigned grid = header != nullptr ? static_cast<unsigned>(sm_count > 0 ? sm_count : 1) * 4
                                          : GridFor(count, sm_count, 4);
  if (header == nullptr && count == 0) return cudaSuccess;
  AdaCompAddKernel<<<grid, kBlock, 0, stream>>>(indices, negative, count, scale, header, factor,
                                                 dst);
  return cudaGetLastError();
}

cudaError_t LaunchDenseAdd(const float* values, size_t n, const Header* header, float factor,
                           float* dst, int sm_count, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  DenseAddKernel<<<GridFor(n, sm_count, 8), kBlock, 0, stream>>>(values, n, header, factor, dst);
  return cudaGetLastError();
}

cudaError_t LaunchSparseAdd(const uint32_t* indices, const float* values, size_t count,
                            float factor, float* dst, int sm_count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  SparseAddKernel<<<GridFor(count, sm_count, 4), kBlock, 0, stream>>>(indices, values, count,
                                                                       factor, dst);
  return cudaGetLastError();
}

cudaError_t LaunchSignAdd(const uint64_t* sign_bits, size_t n, float scale, float scale_neg,
                          float factor, float* dst, int sm_count, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SignAddKernel<<<GridFor(n, sm_count, 8), kBlock, 0, stream>>>(sign_bits, n, scale, scale_neg,
                                                                 factor, dst);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace cuda
}  // namespace adaps
