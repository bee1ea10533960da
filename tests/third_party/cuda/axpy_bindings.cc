// Binds launch_axpy over raw device pointers and a stream handle (no libtorch C++ API).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "axpy.h"

namespace {

void axpy(float alpha, std::uintptr_t x, std::uintptr_t y, long n, std::uintptr_t stream) {
  int devices = 0;
  cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    throw std::runtime_error(std::string("axpy needs a CUDA device: ") + cudaGetErrorString(status));
  }
  status = launch_axpy(alpha, reinterpret_cast<const float*>(x), reinterpret_cast<float*>(y), n,
                       reinterpret_cast<cudaStream_t>(stream));
  if (status != cudaSuccess) throw std::runtime_error(cudaGetErrorString(status));
}

}  // namespace

PYBIND11_MODULE(axpy_ext, m) {
  m.def("axpy", &axpy, "y += alpha * x on device pointers", pybind11::arg("alpha"), pybind11::arg("x"),
        pybind11::arg("y"), pybind11::arg("n"), pybind11::arg("stream") = 0);
}
