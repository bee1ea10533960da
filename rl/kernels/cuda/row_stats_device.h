// Device helpers shared by the logprob and fused-loss kernels: element loads, the online (max, sum exp,
// sum exp * z) triple per row with its block reduction, and one gradient element.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace rlk {

constexpr int kRowThreads = 256;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// Running softmax statistics: m = max z, s = sum exp(z - m), t = sum exp(z - m) * z.
struct Stats {
  float m, s, t;
};

__device__ __forceinline__ Stats merge(Stats a, Stats b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return a;
  float ea = a.m == -INFINITY ? 0.f : expf(a.m - m);
  float eb = b.m == -INFINITY ? 0.f : expf(b.m - m);
  return {m, a.s * ea + b.s * eb, a.t * ea + b.t * eb};
}

__device__ __forceinline__ Stats push(Stats a, float z) {
  if (z == -INFINITY) return a;
  if (z > a.m) {
    float scale = a.m == -INFINITY ? 0.f : expf(a.m - z);
    return {z, a.s * scale + 1.f, a.t * scale + z};
  }
  float e = expf(z - a.m);
  return {a.m, a.s + e, a.t + e * z};
}

// Whole-block reduction of each thread's Stats; every thread gets the row's result.
__device__ __forceinline__ Stats block_merge(Stats x) {
  __shared__ Stats warp_stats[kRowThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    Stats other{__shfl_xor_sync(0xffffffff, x.m, offset), __shfl_xor_sync(0xffffffff, x.s, offset),
                __shfl_xor_sync(0xffffffff, x.t, offset)};
    x = merge(x, other);
  }
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_stats[warp] = x;
  __syncthreads();
  Stats total = warp_stats[0];
  for (int w = 1; w < kRowThreads / 32; ++w) total = merge(total, warp_stats[w]);
  __syncthreads();
  return total;
}

// (logprob of target, entropy, lse) of softmax(row * inv_temp); call with kRowThreads threads.
template <typename T>
__device__ __forceinline__ void row_stats(const T* row, int64_t target, int64_t vocab, float inv_temp, float* lp,
                                          float* entropy, float* lse) {
  Stats acc{-INFINITY, 0.f, 0.f};
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) acc = push(acc, to_float(row[j]) * inv_temp);
  Stats total = block_merge(acc);
  *lse = total.m + logf(total.s);
  *entropy = *lse - total.t / total.s;
  *lp = to_float(row[target]) * inv_temp - *lse;
}

// d loss / d z_j * inv_temp for one column: (g_lp (onehot - p) - g_h p (logp + H)) / T.
template <typename T>
__device__ __forceinline__ T grad_element(T x, bool is_target, float inv_temp, float lse, float entropy, float g_lp,
                                          float g_h) {
  float logp = to_float(x) * inv_temp - lse;
  float p = expf(logp);
  float g = -p * g_lp - (p > 0.f ? p * (logp + entropy) : 0.f) * g_h + (is_target ? g_lp : 0.f);
  return from_float<T>(g * inv_temp);
}

}  // namespace rlk
