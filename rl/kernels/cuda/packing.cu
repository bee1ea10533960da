// Packing kernels: cu_seqlens (one-block scan), position_ids, pack / unpack (element-size templated copies).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels.h"

namespace rlk {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kTileTokens = 64;

// One block: each pass scans kScanThreads lengths in shared memory and adds the running carry.
__global__ void cu_seqlens_kernel(const int32_t* lengths, int32_t* cu, int64_t num_seqs) {
  __shared__ int32_t buf[kScanThreads];
  __shared__ int32_t carry;
  if (threadIdx.x == 0) {
    carry = 0;
    cu[0] = 0;
  }
  __syncthreads();
  for (int64_t base = 0; base < num_seqs; base += kScanThreads) {
    int64_t i = base + threadIdx.x;
    buf[threadIdx.x] = i < num_seqs ? lengths[i] : 0;
    __syncthreads();
    for (int offset = 1; offset < kScanThreads; offset <<= 1) {  // Hillis-Steele inclusive scan
      int32_t add = threadIdx.x >= offset ? buf[threadIdx.x - offset] : 0;
      __syncthreads();
      buf[threadIdx.x] += add;
      __syncthreads();
    }
    if (i < num_seqs) cu[i + 1] = buf[threadIdx.x] + carry;
    __syncthreads();
    if (threadIdx.x == kScanThreads - 1) carry += buf[threadIdx.x];
    __syncthreads();
  }
}

__global__ void position_ids_kernel(const int32_t* cu, int64_t* out) {
  int64_t start = cu[blockIdx.x], length = cu[blockIdx.x + 1] - start;
  for (int64_t t = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < length;
       t += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    out[start + t] = t;
  }
}

// Block (b, tile): tokens tile*kTileTokens.. of sequence b, all `feat` elements each.
template <typename E>
__global__ void pack_kernel(const E* padded, E* out, const int32_t* cu, int64_t width, int64_t feat) {
  int64_t b = blockIdx.x, start = cu[b], length = cu[b + 1] - start;
  int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTileTokens;
  int64_t count = (length - t0 < kTileTokens ? length - t0 : kTileTokens) * feat;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    out[(start + t0) * feat + k] = padded[(b * width + t0) * feat + k];
  }
}

template <typename E>
__global__ void unpack_kernel(const E* packed, E* out, const int32_t* cu, int64_t width, int64_t feat, E pad) {
  int64_t b = blockIdx.x, start = cu[b], length = cu[b + 1] - start;
  int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTileTokens;
  int64_t tiles = (width - t0 < kTileTokens ? width - t0 : kTileTokens) * feat;
  for (int64_t k = threadIdx.x; k < tiles; k += blockDim.x) {
    int64_t t = t0 + k / feat;
    out[(b * width + t0) * feat + k] = t < length ? packed[(start + t0) * feat + k] : pad;
  }
}

template <typename E>
cudaError_t launch_copy(bool packing, const void* src, void* dst, const int32_t* cu, int64_t num_seqs, int64_t width,
                        int64_t feat, uint64_t pad_bits, cudaStream_t stream) {
  dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>((width + kTileTokens - 1) / kTileTokens));
  if (packing) {
    pack_kernel<E><<<grid, 256, 0, stream>>>(static_cast<const E*>(src), static_cast<E*>(dst), cu, width, feat);
  } else {
    E pad;
    memcpy(&pad, &pad_bits, sizeof(E));
    unpack_kernel<E><<<grid, 256, 0, stream>>>(static_cast<const E*>(src), static_cast<E*>(dst), cu, width, feat,
                                                pad);
  }
  return cudaGetLastError();
}

cudaError_t copy(bool packing, const void* src, void* dst, const int32_t* cu, int64_t num_seqs, int64_t width,
                 int64_t feat, int elem_bytes, uint64_t pad_bits, cudaStream_t stream) {
  if (num_seqs == 0 || width == 0 || feat == 0) return cudaSuccess;
  switch (elem_bytes) {
    case 1: return launch_copy<uint8_t>(packing, src, dst, cu, num_seqs, width, feat, pad_bits, stream);
    case 2: return launch_copy<uint16_t>(packing, src, dst, cu, num_seqs, width, feat, pad_bits, stream);
    case 4: return launch_copy<uint32_t>(packing, src, dst, cu, num_seqs, width, feat, pad_bits, stream);
    case 8: return launch_copy<uint64_t>(packing, src, dst, cu, num_seqs, width, feat, pad_bits, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t cu_seqlens(const int32_t* lengths, int32_t* cu, int64_t num_seqs, cudaStream_t stream) {
  cu_seqlens_kernel<<<1, kScanThreads, 0, stream>>>(lengths, cu, num_seqs);
  return cudaGetLastError();
}

cudaError_t position_ids(const int32_t* cu, int64_t* out, int64_t num_seqs, int64_t max_len, cudaStream_t stream) {
  if (num_seqs == 0 || max_len == 0) return cudaSuccess;
  int64_t tiles = (max_len + 255) / 256;
  dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(tiles < 65535 ? tiles : 65535));
  position_ids_kernel<<<grid, 256, 0, stream>>>(cu, out);
  return cudaGetLastError();
}

cudaError_t pack(const void* padded, void* out, const int32_t* cu, int64_t num_seqs, int64_t width, int64_t feat,
                 int elem_bytes, cudaStream_t stream) {
  return copy(true, padded, out, cu, num_seqs, width, feat, elem_bytes, 0, stream);
}

cudaError_t unpack(const void* packed, void* out, const int32_t* cu, int64_t num_seqs, int64_t width, int64_t feat,
                   int elem_bytes, uint64_t pad_bits, cudaStream_t stream) {
  return copy(false, packed, out, cu, num_seqs, width, feat, elem_bytes, pad_bits, stream);
}

}  // namespace rlk
