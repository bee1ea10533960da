// Host launchers of the rl/kernels CUDA ops, over raw device pointers and a stream (no libtorch).
// Layouts and formulas follow rl/kernels/reference (the oracle in tests).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace rlk {

enum class DType : int { kFloat32 = 0, kBFloat16 = 1 };

// Scalar settings of the fused loss; codes as in rl/kernels/reference/policy_terms.py.
struct LossParams {
  int policy;  // 0 regular, 1 dual_clip, 2 cispo
  int kl;      // 0 k1, 1 abs, 2 k2, 3 k3
  bool has_ref, use_kl, use_entropy;
  float inv_temp, eps_low, eps_high, clip_c, kl_coef, entropy_coef;
};

cudaError_t cu_seqlens(const int32_t* lengths, int32_t* cu, int64_t num_seqs, cudaStream_t stream);
cudaError_t position_ids(const int32_t* cu, int64_t* out, int64_t num_seqs, int64_t max_len, cudaStream_t stream);
cudaError_t pack(const void* padded, void* out, const int32_t* cu, int64_t num_seqs, int64_t width, int64_t feat,
                 int elem_bytes, cudaStream_t stream);
cudaError_t unpack(const void* packed, void* out, const int32_t* cu, int64_t num_seqs, int64_t width, int64_t feat,
                   int elem_bytes, uint64_t pad_bits, cudaStream_t stream);

cudaError_t logprobs_forward(const void* logits, DType dtype, const int64_t* targets, float* lp, float* entropy,
                             float* lse, int64_t rows, int64_t vocab, int64_t stride, float inv_temp,
                             cudaStream_t stream);
cudaError_t logprobs_backward(const void* logits, DType dtype, const int64_t* targets, const float* lse,
                              const float* entropy, const float* grad_lp, const float* grad_entropy, void* grad,
                              int64_t rows, int64_t vocab, int64_t stride, float inv_temp, cudaStream_t stream);

// Per row: logprob/entropy, the weighted token loss and metrics (6 columns), and d loss / d logits into `grad`.
cudaError_t fused_loss(const void* logits, DType dtype, const int64_t* targets, const float* old_lp,
                       const float* adv, const float* ref, const float* weight, const float* metric_weight,
                       const float* token_weight, float* token_loss, float* metrics, void* grad, int64_t rows,
                       int64_t vocab, int64_t stride, LossParams params, cudaStream_t stream);

}  // namespace rlk
