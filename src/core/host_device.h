// MT_HOST_DEVICE marks a function that nvcc compiles for both the host and the device (and a plain compiler for the
// host only): the counter-based random numbers and stochastic rounding give the same bits on the CPU and the GPU.
#pragma once

#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif
