#pragma once
#include <cuda_runtime.h>

cudaError_t launch_axpy(float alpha, const float* x, float* y, long n, cudaStream_t stream);
