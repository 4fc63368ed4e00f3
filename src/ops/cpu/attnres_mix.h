// CPU kernels of the Block AttnRes mix (ops/attnres_mix.h): v / dv are arrays of m pointers to [n, c] sources.
#pragma once

#include <cstdint>

namespace mt::ops::cpu {

constexpr int64_t kMaxSources = 32;  // ops/attnres_mix.h's kAttnResMaxSources

// v[j] [n, c] for j < m, query, gain [c], h [n, c], alpha [n, m].
template <typename T>
void attnres_mix_fwd(const T* const* v,
                     const T* query,
                     const T* gain,
                     double eps,
                     T* h,
                     T* alpha,
                     int64_t m,
                     int64_t n,
                     int64_t c,
                     double blend);
// dh [n, c]; dv[j] [n, c] (+=); dquery, dgain [c] (+=).
template <typename T>
void attnres_mix_bwd(const T* const* v,
                     const T* query,
                     const T* gain,
                     double eps,
                     const T* alpha,
                     const T* dh,
                     T* const* dv,
                     T* dquery,
                     T* dgain,
                     int64_t m,
                     int64_t n,
                     int64_t c,
                     double blend);

}  // namespace mt::ops::cpu
