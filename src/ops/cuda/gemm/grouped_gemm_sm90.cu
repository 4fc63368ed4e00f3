// Grouped GEMM for all experts in one launch per product, Hopper (sm_90a) warpgroup MMA, bf16 operands, f32
// accumulation, with the plan's offsets read from device memory (no host copy, no synchronisation, no per-expert
// launches):
//   fwd  y_e   = x_e w_e^T   x [R, K], w [E, M, K]: both operands K-major (wgmma TA = TB = 0)
//   dx   dx_e  = dy_e w_e    dy [R, M] K-major, w_e [M, K] read MN-major (TB = 1); written, or accumulated
//   dw   dw_e += dy_e^T x_e  dy and x both read MN-major (TA = TB = 1); dw bf16 or f32; or written (=)
// Tiles of 128 x 128 outputs, 64 along the contraction per step; two consumer warpgroups of 64 output rows each; a
// 3-stage cp.async ring (all 256 threads load, then meet at one block barrier per step) feeding m64n128k16 products
// from 128-byte-swizzled shared tiles (prim/wgmma_tile.cuh: the layout and descriptors that the attention kernels
// use, K-major and MN-major alike, so no new descriptor form is introduced). Three stages of 32 KB let two blocks
// share an SM, so one block's barrier and epilogue overlap the other's products.
// Which tile a block owns, for fwd and dx (row tiles of variable-size experts): expert e's row tile i gets the linear
// index start(e) + i with start(e) = floor(offsets[e] / 128) + e. start is strictly increasing and expert e has
// ceil(rows_e / 128) <= start(e + 1) - start(e) tiles, so the indices of different experts never collide and every
// index below start(E) = floor(R / 128) + E is either one tile or a gap (a block that exits at once). Each block
// finds its expert with one coalesced pass of its threads over the offsets: no prefix kernel, no host copy.
// dw: a block owns one (expert, 128 rows of M, 128 columns of K) tile and runs over the expert's rows in order,
// 64 at a time (zero-filled past its end): no atomics, the same bits on every run. An empty expert's blocks exit, so
// its dw is unchanged, or, when dw is written, store the zeros of an empty sum. Rows past an expert's end are
// zero-filled in every load and never stored. Offsets are clamped to [0, R] in the kernels, so malformed offsets give
// wrong rows but no access out of bounds. Shapes: K and M multiples of 8 (16-byte rows for cp.async), pointers 16-byte
// aligned; grouped_gemm_sm90_why_not says what fails. f16 (wgmma .f16) and f32 take the cuBLASLt path of
// grouped_linear.cu.
#include <cuda_runtime.h>

#include <string>

#include "core/backend.h"
#include "core/cuda/cuda_check.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm/grouped_gemm_sm90.h"
#include "ops/cuda/prim/cp_async.cuh"
#include "ops/cuda/prim/wgmma.cuh"
#include "ops/cuda/prim/wgmma_tile.cuh"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256, kBM = 128, kBN = 128, kBK = 64, kStages = 3;
constexpr uint32_t kTileBytes = kBM * kBK * 2;  // every operand tile: [128][64] or [64][128] bf16, 16 KB
constexpr uint32_t kStageBytes = 2 * kTileBytes;
constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + the slack of aligning the ring to 1024 bytes

enum class Kind { fwd, dx, dw };

struct Args {
    const bf16* a;           // fwd: x [R, K]; dx, dw: dy [R, M]
    const bf16* b;           // fwd, dx: w [E, M, K]; dw: x [R, K]
    void* out;               // fwd: y [R, M]; dx: dx [R, K]; dw: dw [E, M, K]
    const int32_t* offsets;  // [E + 1] on the device
    int e, rows, k, m;       // E, R, K, M
    int col_tiles;           // fwd, dx: output column tiles; dw: K tiles
    bool accumulate;         // dx, dw: += (else =; y is always written)
};

// offsets[j] clamped to [lo, R]: a malformed plan cannot send a load or store out of bounds.
__device__ __forceinline__ int offset_at(const Args& p, int j, int lo) {
    return min(max(p.offsets[j], lo), p.rows);
}

// One output pair (columns c, c + 1 of a row): written, or added to what is there (f32 sum, one rounding).
__device__ __forceinline__ void store_pair(bf16* dst, float v0, float v1, bool add) {
    auto* d = reinterpret_cast<__nv_bfloat162*>(dst);
    if (add) {
        const float2 old = pair_to_f32(*d);
        v0 += old.x;
        v1 += old.y;
    }
    *d = Pair<bf16>::from(v0, v1);
}
__device__ __forceinline__ void store_pair(float* dst, float v0, float v1, bool add) {
    auto* d = reinterpret_cast<float2*>(dst);
    if (add) {
        const float2 old = *d;
        v0 += old.x;
        v1 += old.y;
    }
    *d = make_float2(v0, v1);
}

#if MT_WGMMA_ENABLED
// The pipeline shared by the three products: nk contraction steps of kBK through the kStages-deep ring. load(a, b,
// j) issues this thread's copies of step j into the stage tiles a and b; mma(a, b) issues the step's four wgmma
// k-slices. At step j every thread waits for its copies of step j, fences them into the async proxy and meets the
// block at the barrier (which also means every warpgroup has finished the products of step j - 1, waited below); the
// products of step j then run while the copies of step j + kStages - 1 go into the stage that step j - 1 read.
template <typename Load, typename Mma>
__device__ __forceinline__ void mainloop(float (&acc)[kBN / 8][4], uint32_t ring, int nk, Load load, Mma mma) {
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    auto tile_a = [&](int j) { return ring + (j % kStages) * kStageBytes; };
#pragma unroll
    for (int j = 0; j < kStages - 1; ++j) {
        if (j < nk) load(tile_a(j), tile_a(j) + kTileBytes, j);
        cp_async_commit();
    }
    for (int j = 0; j < nk; ++j) {
        cp_async_wait<kStages - 2>();  // groups are committed every step (empty ones too): step j's has landed
        fence_proxy_async();
        __syncthreads();
        wgmma_fence();
        mma(tile_a(j), tile_a(j) + kTileBytes);
        wgmma_commit();
        const int next = j + kStages - 1;
        if (next < nk) load(tile_a(next), tile_a(next) + kTileBytes, next);
        cp_async_commit();
        wgmma_wait<0>();
        fence_regs(acc);
    }
}
#endif

// fwd and dx: a block owns output rows [row0, min(row0 + 128, end)) of one expert and columns [n0, n0 + 128).
template <Kind kKind>
__global__ void __launch_bounds__(kThreads, 2) grouped_rows_kernel(const Args p) {
#if MT_WGMMA_ENABLED
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ int s_tile[3];  // expert, first row, the expert's end row
    const uint32_t ring = (smem_u32(smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
    const int tile = static_cast<int>(blockIdx.x / p.col_tiles), n0 = static_cast<int>(blockIdx.x % p.col_tiles) * kBN;
    if (tid == 0) s_tile[0] = -1;
    __syncthreads();
    for (int j = tid; j < p.e; j += kThreads) {  // the one expert whose tiles hold `tile` (see the top)
        const int o0 = offset_at(p, j, 0), o1 = offset_at(p, j + 1, o0), i = tile - (o0 / kBM + j);
        if (i >= 0 && i * kBM < o1 - o0) {
            s_tile[0] = j;
            s_tile[1] = o0 + i * kBM;
            s_tile[2] = o1;
        }
    }
    __syncthreads();
    const int expert = s_tile[0], row0 = s_tile[1], rows = s_tile[2] - s_tile[1];
    if (expert < 0) return;  // a gap: the whole block leaves before any copy
    constexpr bool kFwd = kKind == Kind::fwd;
    const int n = kFwd ? p.m : p.k, red = kFwd ? p.k : p.m;  // output columns, contraction length
    const bf16* a = p.a + static_cast<int64_t>(row0) * red;
    const bf16* w = p.b + static_cast<int64_t>(expert) * p.m * p.k;
    float acc[kBN / 8][4];
    mainloop(
        acc,
        ring,
        (red + kBK - 1) / kBK,
        [&](uint32_t sa, uint32_t sb, int j) {
            const int c0 = j * kBK;
            load_tile_sw<kBM, kBK, kThreads>(sa, a + c0, red, 0, rows, red - c0, tid);  // x or dy rows, K-major
            if constexpr (kFwd)  // w_e rows n0.. (output columns), K-major
                load_tile_sw<kBN, kBK, kThreads>(
                    sb, w + static_cast<int64_t>(n0) * p.k + c0, p.k, 0, p.m - n0, p.k - c0, tid);
            else  // w_e rows c0.. (the contraction), columns n0..: MN-major
                load_tile_sw<kBK, kBN, kThreads>(
                    sb, w + static_cast<int64_t>(c0) * p.k + n0, p.k, 0, p.m - c0, p.k - n0, tid);
        },
        [&](uint32_t sa, uint32_t sb) {
#pragma unroll
            for (int kk = 0; kk < kBK / 16; ++kk) {
                if constexpr (kFwd)
                    wgmma_ss<kBN, 0, 0>(acc, desc_k<kBM>(sa, wg * 64, kk), desc_k<kBN>(sb, 0, kk), 1);
                else
                    wgmma_ss<kBN, 0, 1>(acc, desc_k<kBM>(sa, wg * 64, kk), desc_mn<kBK>(sb, kk * 16), 1);
            }
        });
    bf16* out = static_cast<bf16*>(p.out);
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // accumulator rows r and r + 8 (the mma.sync C layout of each warp)
        const int r = wg * 64 + warp * 16 + lane / 4 + h * 8;
        if (r >= rows) continue;
        bf16* dst = out + static_cast<int64_t>(row0 + r) * n + n0;
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) {
            const int c = i * 8 + (lane % 4) * 2;
            if (n0 + c < n) store_pair(dst + c, acc[i][2 * h], acc[i][2 * h + 1], !kFwd && p.accumulate);
        }
    }
#else
    __trap();  // built without sm_90a; grouped_gemm_sm90_why_not keeps this from launching
#endif
}

// dw: a block owns dw_e rows [m0, m0 + 128) and columns [k0, k0 + 128), summed over the expert's rows in order.
template <typename TW>
__global__ void __launch_bounds__(kThreads, 2) grouped_dw_kernel(const Args p) {
#if MT_WGMMA_ENABLED
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t ring = (smem_u32(smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
    const int m_tiles = (p.m + kBM - 1) / kBM, per_expert = m_tiles * p.col_tiles;
    const int expert = static_cast<int>(blockIdx.x / per_expert), t = static_cast<int>(blockIdx.x % per_expert);
    const int m0 = (t / p.col_tiles) * kBM, k0 = (t % p.col_tiles) * kBN;
    const int r0 = offset_at(p, expert, 0), r1 = offset_at(p, expert + 1, r0);
    if (r1 == r0 && p.accumulate) return;  // an empty expert: dw_e unchanged (written: zeros, nk = 0 below)
    float acc[kBN / 8][4];
    mainloop(
        acc,
        ring,
        (r1 - r0 + kBK - 1) / kBK,
        [&](uint32_t sa, uint32_t sb, int j) {
            const int r = r0 + j * kBK;  // rows [r, r + 64) of dy (columns m0..) and of x (columns k0..)
            load_tile_sw<kBK, kBM, kThreads>(
                sa, p.a + static_cast<int64_t>(r) * p.m + m0, p.m, 0, r1 - r, p.m - m0, tid);
            load_tile_sw<kBK, kBN, kThreads>(
                sb, p.b + static_cast<int64_t>(r) * p.k + k0, p.k, 0, r1 - r, p.k - k0, tid);
        },
        [&](uint32_t sa, uint32_t sb) {
    // A = dy^T: this warpgroup's 64 rows of M are column block wg of the dy tile, read MN-major.
#pragma unroll
            for (int kk = 0; kk < kBK / 16; ++kk)
                wgmma_ss<kBN, 1, 1>(acc, desc_mn<kBK>(sa + wg * (kBK * 128), kk * 16), desc_mn<kBK>(sb, kk * 16), 1);
        });
    TW* dw = static_cast<TW*>(p.out) + static_cast<int64_t>(expert) * p.m * p.k;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = m0 + wg * 64 + warp * 16 + lane / 4 + h * 8;
        if (r >= p.m) continue;
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) {
            const int c = k0 + i * 8 + (lane % 4) * 2;
            if (c < p.k)
                store_pair(dw + static_cast<int64_t>(r) * p.k + c, acc[i][2 * h], acc[i][2 * h + 1], p.accumulate);
        }
    }
#else
    __trap();  // built without sm_90a; grouped_gemm_sm90_why_not keeps this from launching
#endif
}

int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

// Raises the kernels' dynamic shared memory limit once (the four instantiations), then launches one.
void launch(void (*kernel)(Args), int64_t blocks, const Args& p) {
    static const bool configured = [] {
        for (void (*k)(Args) : {grouped_rows_kernel<Kind::fwd>,
                                grouped_rows_kernel<Kind::dx>,
                                grouped_dw_kernel<float>,
                                grouped_dw_kernel<bf16>})
            MT_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
        return true;
    }();
    (void)configured;
    if (blocks == 0) return;
    MT_CHECK(blocks < (int64_t{1} << 31), "grouped GEMM: {} thread blocks do not fit one grid", blocks);
    kernel<<<static_cast<unsigned>(blocks), kThreads, kSmemBytes, core::exec_stream()>>>(p);
    MT_CUDA_CHECK(cudaGetLastError());
}

// fwd and dx: floor(R / 128) + E row tiles (a bound: see the top) times the output's column tiles.
template <Kind kKind>
void launch_rows(const Args& p, int n) {
    Args q = p;
    q.col_tiles = static_cast<int>(ceil_div(n, kBN));
    launch(grouped_rows_kernel<kKind>, (static_cast<int64_t>(p.rows) / kBM + p.e) * q.col_tiles, q);
}

bool sm90_device() {
    static const bool ok = wgmma_kernel_runs(reinterpret_cast<const void*>(grouped_rows_kernel<Kind::fwd>));
    return ok;
}

Args make_args(const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& offsets, int64_t k, int64_t m) {
    return {static_cast<const bf16*>(a.raw()),
            static_cast<const bf16*>(b.raw()),
            out.raw(),
            offsets.data<int32_t>(),
            static_cast<int>(offsets.size(0) - 1),
            static_cast<int>(a.size(0)),
            static_cast<int>(k),
            static_cast<int>(m),
            0,
            false};
}

}  // namespace

std::string grouped_gemm_sm90_why_not(DType x, DType dw, int64_t k, int64_t m) {
    if (x != DType::bf16) return fmt::format("x is {}, the device kernel takes bf16", core::dtype_name(x));
    if (dw != DType::bf16 && dw != DType::f32)
        return fmt::format("dw is {}, the device kernel takes bf16 or f32", core::dtype_name(dw));
    if (k < 8 || m < 8 || k % 8 != 0 || m % 8 != 0)
        return fmt::format("K = {} and M = {} must be positive multiples of 8 (16-byte rows)", k, m);
    if (k >= (int64_t{1} << 30) || m >= (int64_t{1} << 30)) return "K and M must stay below 2^30";
    if (!sm90_device()) return "the device kernel needs an sm_90 GPU (Hopper) and a build for sm_90a";
    return {};
}

void grouped_gemm_sm90_fwd(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y) {
    core::NvtxRange range("grouped_linear_fwd.device");
    const int64_t m = w.size(1), k = w.size(2);
    launch_rows<Kind::fwd>(make_args(x, w, y, offsets, k, m), static_cast<int>(m));
}

void grouped_gemm_sm90_bwd(const Tensor& x,
                           const Tensor& w,
                           const Tensor& offsets,
                           const Tensor& dy,
                           const Tensor& dx,
                           const Tensor& dw,
                           bool accumulate_dx,
                           bool accumulate_dw) {
    core::NvtxRange range("grouped_linear_bwd.device");
    const int64_t e = w.size(0), m = w.size(1), k = w.size(2);
    if (dx.defined()) {
        Args p = make_args(dy, w, dx, offsets, k, m);
        p.accumulate = accumulate_dx;
        launch_rows<Kind::dx>(p, static_cast<int>(k));
    }
    if (!dw.defined()) return;
    Args p = make_args(dy, x, dw, offsets, k, m);
    p.accumulate = accumulate_dw;
    p.col_tiles = static_cast<int>(ceil_div(k, kBN));
    const int64_t blocks = e * ceil_div(m, kBM) * p.col_tiles;
    if (dw.dtype() == DType::f32)
        launch(grouped_dw_kernel<float>, blocks, p);
    else
        launch(grouped_dw_kernel<bf16>, blocks, p);
}

}  // namespace mt::ops::cuda
