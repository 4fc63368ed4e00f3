// Pieces shared by the two tensor-core KDA scans (kda_scan_tc.cu: the forward scan; kda_rscan_tc.cu: the reverse
// scan): shared-memory strides, the 16-bit B fragment, the warps' ownership of the state tiles, the state store and
// the choice of the value tile BV.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ops/cuda/kda/kda_common.cuh"
#include "ops/cuda/kda/kda_mma.cuh"

namespace mt::ops::cuda::kda {

inline constexpr int kScanWarps = kThreads / 32;

// Row strides: 4 mod 32 for tiles read row-wise as A, 8 mod 32 for tiles read transposed.
__host__ __device__ inline int ld_row(int cols) {
    return cols + 4;
}
__host__ __device__ inline int ld_tr(int cols) {
    return cols + 8;
}
// Row stride of the [rows, BV] B-operand tiles (S, Vn, dS, dVn fp32; dO 16-bit): BV + 8 makes the B fragment
// reads conflict-free (rows k0 + t, columns n0 + g) and keeps rows 16-byte aligned.
template <int BV>
__host__ __device__ constexpr int ld_b() {
    return BV + 8;
}

// B[k][n] = X[k][n] from 16-bit values: bf16 and f16 are exact in TF32, so no rounding step.
template <typename T>
__device__ __forceinline__ void frag_b16(uint32_t (&b)[2], const T* x, int ld, int k0, int n0, int g, int t) {
    b[0] = tf32_exact(x[(k0 + t) * ld + n0 + g]);
    b[1] = tf32_exact(x[(k0 + t + 4) * ld + n0 + g]);
}

// Ownership of the [c, BV] products (Vn, O, dVn): warp w takes row tile w % 4 (c = 32 idles w % 4 >= 2) and the
// column tiles w / 4 + 2 i, i < BV / 16. Of the [K, BV] state products: K / 16 row tiles; when that divides 8 the
// 8 / (K / 16) warps of a row tile split its BV / 8 column tiles (tiles nt0 + step i), else warp w < K / 16 owns row
// tile w whole.
struct StateTiles {
    int x0, nt0, step;
    bool on;
};
__device__ inline StateTiles state_tiles(int kd, int warp) {
    const int rt = kd / 16, wpr = kScanWarps % rt == 0 ? kScanWarps / rt : 1;
    return {(warp / wpr) * 16, warp % wpr, wpr, warp / wpr < rt};
}

// A scan's fp32 state (S forward, dS reverse) in the registers of the warps that own its tiles (state_tiles), for the
// whole scan: lane (g, t) holds rows x0 + g, x0 + g + 8 and columns c0, c0 + 1 of each tile. The other warps read the
// state only through a TF32-rounded copy in shared memory (write_copy_t), as the B operand of their products. Keeping
// it in shared memory instead cost a load, a scale and a store of every element per chunk, and a conversion of every
// B fragment read from it.
template <int BV>
struct RegState {
    static constexpr int kTiles = BV / 8;
    StateTiles stl;
    int r0, t;
    float s[kTiles][4] = {};
    __device__ RegState(int kd, int warp, int lane) : stl(state_tiles(kd, warp)), r0(stl.x0 + lane / 4), t(lane % 4) {}
    // First column of tile i (>= BV: not this warp's).
    __device__ __forceinline__ int tile_n0(int i) const {
        return (stl.nt0 + stl.step * i) * 8;
    }
    // fn(i, c0) for each of this warp's tiles i, c0 the lane's first column.
    template <typename Fn>
    __device__ __forceinline__ void each(Fn&& fn) const {
        if (!stl.on) return;
#pragma unroll
        for (int i = 0; i < kTiles; ++i)
            if (tile_n0(i) < BV) fn(i, tile_n0(i) + 2 * t);
    }
    // From a [K, V] global matrix whose column y0 is src (null: zeros).
    __device__ __forceinline__ void load(const float* src, int vd) {
        each([&](int i, int c0) {
            if (src == nullptr) return;
            const float* p = src + static_cast<int64_t>(r0) * vd + c0;
            s[i][0] = p[0];
            s[i][1] = p[1];
            s[i][2] = p[8 * static_cast<int64_t>(vd)];
            s[i][3] = p[8 * static_cast<int64_t>(vd) + 1];
        });
    }
    // Into a [K, V] global matrix (fp32, or bf16 rounded to nearest) whose column y0 is dst.
    template <typename E>
    __device__ __forceinline__ void store(E* dst, int vd) const {
        each([&](int i, int c0) {
            E* p = dst + static_cast<int64_t>(r0) * vd + c0;
            store_pair(p, s[i][0], s[i][1]);
            store_pair(p + 8 * static_cast<int64_t>(vd), s[i][2], s[i][3]);
        });
    }
    // The TF32 copy in shared memory (this warp's tiles), transposed, [BV, ld] (ld = ld_row(K)): the B operand of the
    // products with the state, read by frag_bt_x4.
    __device__ __forceinline__ void write_copy_t(float* copy, int ld) const {
        each([&](int i, int c0) {
            copy[c0 * ld + r0] = tf32_bits(s[i][0]);
            copy[(c0 + 1) * ld + r0] = tf32_bits(s[i][1]);
            copy[c0 * ld + r0 + 8] = tf32_bits(s[i][2]);
            copy[(c0 + 1) * ld + r0 + 8] = tf32_bits(s[i][3]);
        });
    }
    // Zeros in this warp's tiles (a state restarting at a chunk_resets chunk).
    __device__ __forceinline__ void clear() {
        each([&](int i, int) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[i][e] = 0.0f;
        });
    }
    // Rows x0 + g and x0 + g + 8 times e0 and e1 (the chunk's decay of this lane's rows).
    __device__ __forceinline__ void scale(float e0, float e1) {
        each([&](int i, int) {
            s[i][0] *= e0;
            s[i][1] *= e0;
            s[i][2] *= e1;
            s[i][3] *= e1;
        });
    }
};

// What one B load of row_tile_product holds (b[0], b[1]): k-step k of the warp's column tiles n0 and n0 + 16 (its
// tiles i and i + 1) when it has several (kN > 1), else k-steps k and k + 8 of its one tile n0. b_pair_dn is the dn
// of bt_x4_lane for those; b_pair_frags builds the pair from single-fragment loads frag(b, k, n0).
template <int kN>
__device__ __forceinline__ constexpr int b_pair_dn() {
    return kN > 1 ? 16 : 0;
}
template <int kN, typename Frag>
__device__ __forceinline__ void b_pair_frags(uint32_t (&b)[2][2], int k, int n0, Frag&& frag) {
    frag(b[0], k, n0);
    if constexpr (kN > 1)
        frag(b[1], k, n0 + 16);
    else
        frag(b[1], k + 8, n0);
}

// acc[h][i] += A(:, k0 + 8h) B(k0 + 8h, column tile nb + 2i) for k0 = k_begin, k_begin + 16, ... < k_end: the
// [16, BV] row-tile products of the scans (Vn, O, dVn), as two interleaved chains over k (even and odd 8-steps) that
// the caller adds at the end. a_frag(a, k) loads the A fragment of k-step k, b_pair(b, k, n0) two B fragments
// (b_pair_dn). kN is 1 or even.
template <int kN, typename AFrag, typename BPair>
__device__ __forceinline__ void row_tile_product(
    float (&acc)[2][kN][4], int k_begin, int k_end, int nb, AFrag&& a_frag, BPair&& b_pair) {
    for (int k0 = k_begin; k0 < k_end; k0 += 16) {
        if constexpr (kN == 1) {
            uint32_t a[2][4], bb[2][2];
            a_frag(a[0], k0);
            a_frag(a[1], k0 + 8);
            b_pair(bb, k0, nb * 8);
            mma_tf32(acc[0][0], a[0], bb[0]);
            mma_tf32(acc[1][0], a[1], bb[1]);
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint32_t a[4];
                a_frag(a, k0 + 8 * h);
#pragma unroll
                for (int i = 0; i < kN; i += 2) {
                    uint32_t bb[2][2];
                    b_pair(bb, k0 + 8 * h, (nb + 2 * i) * 8);
                    mma_tf32(acc[h][i], a, bb[0]);
                    mma_tf32(acc[h][i + 1], a, bb[1]);
                }
            }
        }
    }
}

// Two row-tile products sharing their B operand: acc1 += A1 B and acc2 += A2 B, each summed in row_tile_product's
// order (so either sum is bitwise the one row_tile_product gives), with one B fragment load for both.
template <int kN, typename AFrag1, typename AFrag2, typename BPair>
__device__ __forceinline__ void row_tile_product2(float (&acc1)[2][kN][4],
                                                  float (&acc2)[2][kN][4],
                                                  int k_begin,
                                                  int k_end,
                                                  int nb,
                                                  AFrag1&& a_frag1,
                                                  AFrag2&& a_frag2,
                                                  BPair&& b_pair) {
    for (int k0 = k_begin; k0 < k_end; k0 += 16) {
        if constexpr (kN == 1) {
            uint32_t a1[2][4], a2[2][4], bb[2][2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                a_frag1(a1[h], k0 + 8 * h);
                a_frag2(a2[h], k0 + 8 * h);
            }
            b_pair(bb, k0, nb * 8);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mma_tf32(acc1[h][0], a1[h], bb[h]);
                mma_tf32(acc2[h][0], a2[h], bb[h]);
            }
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint32_t a1[4], a2[4];
                a_frag1(a1, k0 + 8 * h);
                a_frag2(a2, k0 + 8 * h);
#pragma unroll
                for (int i = 0; i < kN; i += 2) {
                    uint32_t bb[2][2];
                    b_pair(bb, k0 + 8 * h, (nb + 2 * i) * 8);
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        mma_tf32(acc1[h][i + e], a1, bb[e]);
                        mma_tf32(acc2[h][i + e], a2, bb[e]);
                    }
                }
            }
        }
    }
}

// Copies the [K, BV] state columns (row stride ld_b) to a [K, V] global matrix at column y0, 16 bytes per copy.
template <int BV>
__device__ __forceinline__ void store_state(float* dst, const float* ss, int kd, int vd) {
    constexpr int per = BV / 4;
    for (int e = threadIdx.x; e < kd * per; e += kThreads) {
        const int x = e / per, y = (e % per) * 4;
        *reinterpret_cast<float4*>(dst + static_cast<int64_t>(x) * vd + y) =
            *reinterpret_cast<const float4*>(ss + x * ld_b<BV>() + y);
    }
}

// Calls fn(std::integral_constant<int, BV>{}) for the value tile bv: 16, 32, 64, or else 128.
template <typename Fn>
void with_bv(int bv, Fn&& fn) {
    switch (bv) {
        case 16:
            fn(std::integral_constant<int, 16>{});
            break;
        case 32:
            fn(std::integral_constant<int, 32>{});
            break;
        case 64:
            fn(std::integral_constant<int, 64>{});
            break;
        default:
            fn(std::integral_constant<int, 128>{});
            break;
    }
}

template <typename K>
void set_smem(K kernel, size_t bytes) {
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The value tile of a scan: the BV in {16, 32, 64, 128} (up to max_bv, dividing V, its shared memory within the
// device's limit) of least modelled time, waves * (256 + BV): one block per SM (the chunk tiles take most of the
// shared memory at every BV), and a chunk step costing a fixed ~256 columns' worth (the ~112 KB tile stream and the
// step's latency) plus BV columns of products. `forced` (ops::KdaKernels::scan_bv, rscan_bv) is taken where it fits.
int pick_bv(const Dims& d, int forced, int (*floats)(const Dims&, int));

}  // namespace mt::ops::cuda::kda
