// Shared pieces of the GPU kernel benchmarks: median CUDA-event timing on the ops' stream (or wall-clock timing on
// the CPU), and a finiteness check of a result. Header-only: each bench/*.cpp is its own executable.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"

#ifdef MT_HAVE_CUDA
#include "core/cuda/cuda_check.h"
#endif

namespace mt::bench {

// A bf16 device tensor of pseudo-random values in about [-2, 2) * scale (xorshift; fast for 10^8 elements).
inline core::Tensor random_bf16(const core::Shape& shape, uint64_t seed, float scale = 1.0f) {
    const int64_t n = core::shape_numel(shape);
    std::vector<uint16_t> host(static_cast<size_t>(n));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; ++i) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        const float u = static_cast<float>(s >> 40) / static_cast<float>(1 << 24);  // [0, 1)
        host[static_cast<size_t>(i)] = core::f32_to_bf16((4.0f * u - 2.0f) * scale);
    }
    return core::Tensor::borrow(host.data(), shape, core::DType::bf16).to_device(core::Device::cuda);
}

// Median milliseconds of fn over iters runs after warmup runs, each run between two events on the ops' stream
// (0 in a build without CUDA).
inline double time_ms(const std::function<void()>& fn, int warmup, int iters) {
#ifdef MT_HAVE_CUDA
    for (int i = 0; i < warmup; ++i) fn();
    std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(iters));
    for (auto& e : ev) MT_CUDA_CHECK(cudaEventCreate(&e));
    const cudaStream_t stream = core::exec_stream();
    for (int i = 0; i < iters; ++i) {
        MT_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream));
        fn();
        MT_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
    }
    MT_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> ms(static_cast<size_t>(iters));
    for (int i = 0; i < iters; ++i) {
        float m = 0;
        MT_CUDA_CHECK(cudaEventElapsedTime(&m, ev[2 * i], ev[2 * i + 1]));
        ms[static_cast<size_t>(i)] = m;
    }
    for (auto& e : ev) MT_CUDA_CHECK(cudaEventDestroy(e));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
#else
    (void)fn, (void)warmup, (void)iters;
    return 0.0;
#endif
}

// Milliseconds of fn on `device`: time_ms's CUDA events on the ops' stream (which also see host work between them,
// as the events bracket it), or the wall clock on the CPU, where ops run synchronously; the median of iters runs after
// warmup.
inline double time_ms_on(core::Device device, const std::function<void()>& fn, int warmup, int iters) {
    if (device != core::Device::cpu) return time_ms(fn, warmup, iters);
    for (int i = 0; i < warmup; ++i) fn();
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// True when every element of t (any device, any float dtype) is finite.
inline bool all_finite(const core::Tensor& t) {
    const core::Tensor h = t.to_device(core::Device::cpu).to(core::DType::f32);
    const float* p = h.data<float>();
    for (int64_t i = 0; i < h.numel(); ++i)
        if (!std::isfinite(p[i])) return false;
    return true;
}

}  // namespace mt::bench
