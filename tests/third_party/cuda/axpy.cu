// A minimal kernel that exercises the nvcc rule and the pybind11 extension rule end to end.
#include <cuda_runtime.h>

#include "axpy.h"

namespace {

__global__ void axpy_kernel(float alpha, const float* x, float* y, long n) {
  long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += alpha * x[i];
}

}  // namespace

cudaError_t launch_axpy(float alpha, const float* x, float* y, long n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  const long blocks = (n + threads - 1) / threads;
  axpy_kernel<<<blocks, threads, 0, stream>>>(alpha, x, y, n);
  return cudaGetLastError();
}
