// Per-token GRPO/PPO loss terms and their derivatives: a mirror of rl/kernels/reference/policy_terms.py.
#pragma once
#include <cuda_runtime.h>

#include <cmath>

#include "kernels.h"

namespace rlk {

constexpr float kLogRatioBound = 20.f;
constexpr float kK3Bound = 10.f;

__device__ __forceinline__ float within(float x, float low, float high) {
  return (x >= low && x <= high) ? 1.f : 0.f;
}
__device__ __forceinline__ float clampf(float x, float low, float high) { return fminf(fmaxf(x, low), high); }

struct PolicyTerm {
  float loss, grad, clip, lower;
};

__device__ __forceinline__ PolicyTerm policy_term(float lp, float old_lp, float adv, const LossParams& p) {
  float log_ratio = lp - old_lp;
  float ratio = expf(clampf(log_ratio, -kLogRatioBound, kLogRatioBound));
  float d_ratio = ratio * within(log_ratio, -kLogRatioBound, kLogRatioBound);
  float low = 1.f - p.eps_low, high = 1.f + p.eps_high;
  if (p.policy == 2) {  // cispo
    float weight = fminf(ratio, high);
    return {-weight * adv * lp, -weight * adv, ratio > high ? 1.f : 0.f, 0.f};
  }
  float unclipped = -adv * ratio;
  float clipped = -adv * clampf(ratio, low, high);
  float loss = fmaxf(unclipped, clipped);
  float d_un = -adv * d_ratio, d_cl = -adv * d_ratio * within(ratio, low, high);
  float grad = unclipped > clipped ? d_un : (unclipped < clipped ? d_cl : 0.5f * (d_un + d_cl));
  PolicyTerm out{loss, grad, clipped > unclipped ? 1.f : 0.f, 0.f};
  if (p.policy == 1 && adv < 0.f) {  // dual clip
    float cap = -adv * p.clip_c;
    out.lower = loss > cap ? 1.f : 0.f;
    out.grad = loss < cap ? grad : (loss > cap ? 0.f : 0.5f * grad);
    out.loss = fminf(loss, cap);
  }
  return out;
}

__device__ __forceinline__ void kl_term(float lp, float ref, int kind, float* value, float* grad) {
  float diff = lp - ref;
  if (kind == 0) {
    *value = diff;
    *grad = 1.f;
  } else if (kind == 1) {
    *value = fabsf(diff);
    *grad = diff > 0.f ? 1.f : (diff < 0.f ? -1.f : 0.f);
  } else if (kind == 2) {
    *value = 0.5f * diff * diff;
    *grad = diff;
  } else {
    float x = -diff;
    float xc = clampf(x, -kLogRatioBound, kLogRatioBound);
    float ex = expf(xc);
    float raw = ex - xc - 1.f;
    *grad = -(ex - 1.f) * within(x, -kLogRatioBound, kLogRatioBound) * within(raw, -kK3Bound, kK3Bound);
    *value = clampf(raw, -kK3Bound, kK3Bound);
  }
}

}  // namespace rlk
