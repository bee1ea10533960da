// The fused GRPO/PPO loss: per row one online pass for logprob/entropy, the token loss and its derivatives,
// then a second pass writing d loss / d logits. One block per row.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels.h"
#include "loss_math_device.h"
#include "row_stats_device.h"

namespace rlk {
namespace {

template <typename T>
__global__ void fused_loss_kernel(const T* logits, const int64_t* targets, const float* old_lp, const float* adv,
                                  const float* ref, const float* weight, const float* metric_weight,
                                  const float* token_weight, float* token_loss, float* metrics, T* grad,
                                  int64_t vocab, int64_t stride, LossParams p) {
  __shared__ float row_grads[2];
  int64_t row = blockIdx.x;
  const T* x = logits + row * stride;
  int64_t target = targets[row];
  float lp, entropy, lse;
  row_stats(x, target, vocab, p.inv_temp, &lp, &entropy, &lse);
  if (threadIdx.x == 0) {
    float w = weight[row], mw = metric_weight[row], tw = token_weight[row];
    bool on = w != 0.f;
    PolicyTerm pg = policy_term(lp, old_lp[row], adv[row], p);
    float total = pg.loss, d_lp = pg.grad, kl = 0.f, d_kl = 0.f, d_h = 0.f;
    if (p.has_ref) {
      kl_term(lp, ref[row], p.kl, &kl, &d_kl);
      if (p.use_kl) {
        total = total + p.kl_coef * kl;
        d_lp = d_lp + p.kl_coef * d_kl;
      }
    }
    if (p.use_entropy) {
      total = total - p.entropy_coef * entropy;
      d_h = -p.entropy_coef;
    }
    token_loss[row] = on ? w * total : 0.f;
    float* m = metrics + row * 6;
    m[0] = on ? mw * pg.loss : 0.f;
    m[1] = on ? mw * kl : 0.f;
    m[2] = on ? mw * entropy : 0.f;
    m[3] = tw * pg.clip;
    m[4] = tw * pg.lower;
    m[5] = on ? tw * (old_lp[row] - lp) : 0.f;
    row_grads[0] = on ? w * d_lp : 0.f;
    row_grads[1] = on ? w * d_h : 0.f;
  }
  __syncthreads();
  float g_lp = row_grads[0], g_h = row_grads[1];
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    grad[row * stride + j] = grad_element(x[j], j == target, p.inv_temp, lse, entropy, g_lp, g_h);
  }
}

}  // namespace

cudaError_t fused_loss(const void* logits, DType dtype, const int64_t* targets, const float* old_lp,
                       const float* adv, const float* ref, const float* weight, const float* metric_weight,
                       const float* token_weight, float* token_loss, float* metrics, void* grad, int64_t rows,
                       int64_t vocab, int64_t stride, LossParams params, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (dtype == DType::kFloat32) {
    fused_loss_kernel<float><<<rows, kRowThreads, 0, stream>>>(
        static_cast<const float*>(logits), targets, old_lp, adv, ref, weight, metric_weight, token_weight,
        token_loss, metrics, static_cast<float*>(grad), vocab, stride, params);
  } else {
    fused_loss_kernel<__nv_bfloat16><<<rows, kRowThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(logits), targets, old_lp, adv, ref, weight, metric_weight, token_weight,
        token_loss, metrics, static_cast<__nv_bfloat16*>(grad), vocab, stride, params);
  }
  return cudaGetLastError();
}

}  // namespace rlk
