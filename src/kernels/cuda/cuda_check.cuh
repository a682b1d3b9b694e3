// Error checks of the CUDA backend (included by src/kernels/cuda/ only): CUDA_CHECK and
// CUBLAS_CHECK abort with the failing expression, file and line; CUDA_CHECK_LAUNCH follows
// every kernel launch.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/check.h"
#include "core/context.h"

#define CUDA_CHECK(expr)                                                                        \
  do {                                                                                          \
    cudaError_t grpo_cuda_err_ = (expr);                                                        \
    if (grpo_cuda_err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "CUDA error %s (%s) in %s\n", cudaGetErrorName(grpo_cuda_err_),      \
                   cudaGetErrorString(grpo_cuda_err_), #expr);                                  \
      ::grpo::check_failed(#expr, __FILE__, __LINE__, cudaGetErrorString(grpo_cuda_err_));      \
    }                                                                                           \
  } while (0)

#define CUBLAS_CHECK(expr)                                                                      \
  do {                                                                                          \
    cublasStatus_t grpo_blas_st_ = (expr);                                                      \
    if (grpo_blas_st_ != CUBLAS_STATUS_SUCCESS) {                                               \
      std::fprintf(stderr, "cuBLAS status %d in %s\n", int(grpo_blas_st_), #expr);             \
      ::grpo::check_failed(#expr, __FILE__, __LINE__, "cuBLAS call failed");                    \
    }                                                                                           \
  } while (0)

// After every kernel launch: catches bad configurations (grid, shared memory).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// The rest of the backend's private helpers, each in its own header; files that include only
// this one (attention*.cu) still get all of them.
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/env_switch.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/workspace.cuh"
