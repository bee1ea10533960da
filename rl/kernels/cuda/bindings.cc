// pybind11 bindings of the rl/kernels CUDA ops over raw device pointers and a stream handle: no libtorch, so the
// extension does not depend on the C++ ABI of the torch it runs beside. Python wrapper: rl/kernels/cuda/ext.py.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels.h"

namespace py = pybind11;
using ptr = std::uintptr_t;

namespace {

void require_device() {
  int devices = 0;
  cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    throw std::runtime_error(std::string("rl_kernels_cuda needs a CUDA device (set trainer.kernels=torch or triton "
                                         "on a machine without one): ") +
                             cudaGetErrorString(status));
  }
}

void check(cudaError_t status, const char* op) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(op) + ": " + cudaGetErrorString(status));
}

template <typename T>
T* as(ptr p) {
  return reinterpret_cast<T*>(p);
}

cudaStream_t stream_of(ptr s) { return reinterpret_cast<cudaStream_t>(s); }

rlk::DType dtype_of(int code) {
  if (code != 0 && code != 1) throw std::invalid_argument("dtype code must be 0 (float32) or 1 (bfloat16)");
  return static_cast<rlk::DType>(code);
}

}  // namespace

PYBIND11_MODULE(rl_kernels_cuda, m) {
  m.doc() = "CUDA kernels of rl/kernels over raw device pointers";
  m.def("cu_seqlens", [](ptr lengths, ptr cu, int64_t num_seqs, ptr stream) {
    require_device();
    check(rlk::cu_seqlens(as<const int32_t>(lengths), as<int32_t>(cu), num_seqs, stream_of(stream)), "cu_seqlens");
  });
  m.def("position_ids", [](ptr cu, ptr out, int64_t num_seqs, int64_t max_len, ptr stream) {
    require_device();
    check(rlk::position_ids(as<const int32_t>(cu), as<int64_t>(out), num_seqs, max_len, stream_of(stream)),
          "position_ids");
  });
  m.def("pack", [](ptr padded, ptr out, ptr cu, int64_t num_seqs, int64_t width, int64_t feat, int elem_bytes,
                   ptr stream) {
    require_device();
    check(rlk::pack(as<const void>(padded), as<void>(out), as<const int32_t>(cu), num_seqs, width, feat, elem_bytes,
                    stream_of(stream)),
          "pack");
  });
  m.def("unpack", [](ptr packed, ptr out, ptr cu, int64_t num_seqs, int64_t width, int64_t feat, int elem_bytes,
                     uint64_t pad_bits, ptr stream) {
    require_device();
    check(rlk::unpack(as<const void>(packed), as<void>(out), as<const int32_t>(cu), num_seqs, width, feat,
                      elem_bytes, pad_bits, stream_of(stream)),
          "unpack");
  });
  m.def("logprobs_forward", [](ptr logits, int dtype, ptr targets, ptr lp, ptr entropy, ptr lse, int64_t rows,
                               int64_t vocab, int64_t stride, float inv_temp, ptr stream) {
    require_device();
    check(rlk::logprobs_forward(as<const void>(logits), dtype_of(dtype), as<const int64_t>(targets), as<float>(lp),
                                as<float>(entropy), as<float>(lse), rows, vocab, stride, inv_temp, stream_of(stream)),
          "logprobs_forward");
  });
  m.def("logprobs_backward", [](ptr logits, int dtype, ptr targets, ptr lse, ptr entropy, ptr grad_lp,
                                ptr grad_entropy, ptr grad, int64_t rows, int64_t vocab, int64_t stride,
                                float inv_temp, ptr stream) {
    require_device();
    check(rlk::logprobs_backward(as<const void>(logits), dtype_of(dtype), as<const int64_t>(targets),
                                 as<const float>(lse), as<const float>(entropy), as<const float>(grad_lp),
                                 as<const float>(grad_entropy), as<void>(grad), rows, vocab, stride, inv_temp,
                                 stream_of(stream)),
          "logprobs_backward");
  });
  m.def("fused_loss", [](ptr logits, int dtype, ptr targets, ptr old_lp, ptr adv, ptr ref, ptr weight,
                         ptr metric_weight, ptr token_weight, ptr token_loss, ptr metrics, ptr grad, int64_t rows,
                         int64_t vocab, int64_t stride, py::dict settings, ptr stream) {
    require_device();
    rlk::LossParams p{settings["policy"].cast<int>(),        settings["kl"].cast<int>(),
                      settings["has_ref"].cast<bool>(),      settings["use_kl"].cast<bool>(),
                      settings["use_entropy"].cast<bool>(),  settings["inv_temp"].cast<float>(),
                      settings["eps_low"].cast<float>(),     settings["eps_high"].cast<float>(),
                      settings["clip_c"].cast<float>(),      settings["kl_coef"].cast<float>(),
                      settings["entropy_coef"].cast<float>()};
    check(rlk::fused_loss(as<const void>(logits), dtype_of(dtype), as<const int64_t>(targets),
                          as<const float>(old_lp), as<const float>(adv), as<const float>(ref),
                          as<const float>(weight), as<const float>(metric_weight), as<const float>(token_weight),
                          as<float>(token_loss), as<float>(metrics), as<void>(grad), rows, vocab, stride, p,
                          stream_of(stream)),
          "fused_loss");
  });
}
