// Token logprob / entropy / lse per row (one block per row, online over the vocabulary) and its backward.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels.h"
#include "row_stats_device.h"

namespace rlk {
namespace {

constexpr int kGradColumns = 2048;  // columns per backward block

template <typename T>
__global__ void forward_kernel(const T* logits, const int64_t* targets, float* lp, float* entropy, float* lse,
                               int64_t vocab, int64_t stride, float inv_temp) {
  int64_t row = blockIdx.x;
  float row_lp, row_entropy, row_lse;
  row_stats(logits + row * stride, targets[row], vocab, inv_temp, &row_lp, &row_entropy, &row_lse);
  if (threadIdx.x == 0) {
    lp[row] = row_lp;
    entropy[row] = row_entropy;
    lse[row] = row_lse;
  }
}

template <typename T>
__global__ void backward_kernel(const T* logits, const int64_t* targets, const float* lse, const float* entropy,
                                const float* grad_lp, const float* grad_entropy, T* grad, int64_t vocab,
                                int64_t stride, float inv_temp) {
  int64_t row = blockIdx.x;
  int64_t target = targets[row];
  float l = lse[row], h = entropy[row], g_lp = grad_lp[row], g_h = grad_entropy[row];
  int64_t end = (blockIdx.y + 1) * static_cast<int64_t>(kGradColumns);
  end = end < vocab ? end : vocab;
  for (int64_t j = blockIdx.y * static_cast<int64_t>(kGradColumns) + threadIdx.x; j < end; j += blockDim.x) {
    grad[row * stride + j] = grad_element(logits[row * stride + j], j == target, inv_temp, l, h, g_lp, g_h);
  }
}

}  // namespace

cudaError_t logprobs_forward(const void* logits, DType dtype, const int64_t* targets, float* lp, float* entropy,
                             float* lse, int64_t rows, int64_t vocab, int64_t stride, float inv_temp,
                             cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (dtype == DType::kFloat32) {
    forward_kernel<float><<<rows, kRowThreads, 0, stream>>>(static_cast<const float*>(logits), targets, lp, entropy,
                                                            lse, vocab, stride, inv_temp);
  } else {
    forward_kernel<__nv_bfloat16><<<rows, kRowThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(logits),
                                                                    targets, lp, entropy, lse, vocab, stride,
                                                                    inv_temp);
  }
  return cudaGetLastError();
}

cudaError_t logprobs_backward(const void* logits, DType dtype, const int64_t* targets, const float* lse,
                              const float* entropy, const float* grad_lp, const float* grad_entropy, void* grad,
                              int64_t rows, int64_t vocab, int64_t stride, float inv_temp, cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return cudaSuccess;
  dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((vocab + kGradColumns - 1) / kGradColumns));
  if (dtype == DType::kFloat32) {
    backward_kernel<float><<<grid, kRowThreads, 0, stream>>>(static_cast<const float*>(logits), targets, lse,
                                                             entropy, grad_lp, grad_entropy,
                                                             static_cast<float*>(grad), vocab, stride, inv_temp);
  } else {
    backward_kernel<__nv_bfloat16><<<grid, kRowThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(logits), targets, lse, entropy, grad_lp, grad_entropy,
        static_cast<__nv_bfloat16*>(grad), vocab, stride, inv_temp);
  }
  return cudaGetLastError();
}

}  // namespace rlk
