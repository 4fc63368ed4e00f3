// Tensor-core versions of the two sequential KDA scans (kda.md §4.5 step 6 and §4.6 step 3), used for bf16 and f16
// inputs when K % 16 == 0, K <= 128 and V % 16 == 0 (kda::use_tc). Same work split as the fp32 kernels: one block
// per (16 value columns, unit), chunks in order (or reverse), the fp32 state columns in shared memory. Each product
// is TF32 mma.sync m16n8k8 with fp32 accumulation; the state update accumulates into the fp32 state itself
// (D = gamma * S + Kg^T Vn), so rounding enters only through the operands of each product. The per-chunk tiles of
// the fp32 workspace are staged by cp.async and reloaded for the next chunk as soon as a step has consumed them,
// so the loads overlap the rest of the chunk. Warps own fixed output tiles and sum over k in a fixed order:
// deterministic.
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kda_common.cuh"
#include "ops/cuda/kda_mma.cuh"

namespace mt::ops::cuda::kda {

namespace {

constexpr int kWarps = kThreads / 32;
constexpr int kLdB = kBV + 8;  // row stride of the [rows, 16] B tiles (state, Vn, dO, dVn)

// Row strides: 4 mod 32 for tiles read row-wise as A, 8 mod 32 for tiles read transposed.
__host__ __device__ inline int ld_row(int cols) {
    return cols + 4;
}
__host__ __device__ inline int ld_tr(int cols) {
    return cols + 8;
}

// Forward shared memory (floats): W, Qg [c, ld_row(K)], Kg [c, ld_tr(K)], A [c, ld_row(c)], U [c, 16], gamma-log
// [K], S [K, kLdB], Vn [c, kLdB].
__host__ __device__ inline int scan_tc_floats(const Dims& d) {
    return 2 * d.c * ld_row(d.k) + d.c * ld_tr(d.k) + d.c * ld_row(d.c) + d.c * kBV + d.k + d.k * kLdB + d.c * kLdB;
}
// Backward: Kg [c, ld_row(K)], Qg, W [c, ld_tr(K)], A [c, ld_tr(c)], gamma-log [K], dS [K, kLdB], dO, dVn [c, kLdB].
__host__ __device__ inline int rscan_tc_floats(const Dims& d) {
    return d.c * ld_row(d.k) + 2 * d.c * ld_tr(d.k) + d.c * ld_tr(d.c) + d.k + d.k * kLdB + 2 * d.c * kLdB;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) scan_tc_kernel(
    const float* __restrict__ s0, T* __restrict__ out, float* __restrict__ st, Dims d, Work w, float* hs, float* vns) {
    extern __shared__ __align__(16) float smem[];
    const int c = d.c, kd = d.k, vd = d.v, tid = threadIdx.x;
    const int unit = blockIdx.y, b = unit / d.hv, hv = unit % d.hv, y0 = blockIdx.x * kBV;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int ldr = ld_row(kd), ldt = ld_tr(kd), lda = ld_row(c);
    float* sw = smem;             // W
    float* sq = sw + c * ldr;     // Qg
    float* sk = sq + c * ldr;     // Kg
    float* sa = sk + c * ldt;     // A
    float* su = sa + c * lda;     // U columns [c, 16]
    float* sg = su + c * kBV;     // Gamma of the chunk's last row [K]
    float* ss = sg + kd;          // state columns [K, kLdB]
    float* svn = ss + kd * kLdB;  // Vn [c, kLdB]
    const int64_t kv = static_cast<int64_t>(kd) * vd;
    for (int e = tid; e < kd * kBV; e += blockDim.x) {
        const int x = e / kBV, y = e % kBV;
        ss[x * kLdB + y] = s0 != nullptr ? s0[unit * kv + static_cast<int64_t>(x) * vd + y0 + y] : 0.0f;
    }
    // Loads of chunk n in three groups, in the order the steps consume them.
    auto load_wu = [&](int n) {
        const int64_t cb = chunk_index(d, unit, n);
        stage_async(sw, ldr, w.w + ck_off(d, cb), kd, c, kd);
        stage_async(su, kBV, w.u + cv_off(d, cb) + y0, vd, c, kBV);
    };
    auto load_qa = [&](int n) {
        const int64_t cb = chunk_index(d, unit, n);
        stage_async(sq, ldr, w.qg + ck_off(d, cb), kd, c, kd);
        stage_async(sa, lda, w.a + cc_off(d, cb), c, c, c);
    };
    auto load_kg = [&](int n) {
        const int64_t cb = chunk_index(d, unit, n);
        stage_async(sk, ldt, w.kg + ck_off(d, cb), kd, c, kd);
        stage_async(sg, kd, w.gam + ck_off(d, cb) + static_cast<int64_t>(c - 1) * kd, kd, 1, kd);
    };
    load_wu(0);
    cp_async_commit();
    load_qa(0);
    cp_async_commit();
    load_kg(0);
    cp_async_commit();
    // Output tiles of the [c, 16] products: warp -> (row tile, column tile); c = 32 leaves warps 4..7 idle there.
    const int mt = warp >> 1, nt = warp & 1, m0 = mt * 16, n0 = nt * 8;
    const bool has_tile = m0 < c;
    for (int n = 0; n < d.nc; ++n) {
        const int64_t cb = chunk_index(d, unit, n);
        const bool more = n + 1 < d.nc;
        cp_async_wait<2>();
        __syncthreads();
        if (hs != nullptr)
            for (int e = tid; e < kd * kBV; e += blockDim.x) {
                const int x = e / kBV, y = e % kBV;
                hs[cb * kv + static_cast<int64_t>(x) * vd + y0 + y] = ss[x * kLdB + y];
            }
        // Step 1: Vn = U - W S.
        if (has_tile) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int k0 = 0; k0 < kd; k0 += 8) {
                uint32_t a[4], bb[2];
                frag_a(a, sw, ldr, m0, k0, g, t);
                frag_b(bb, ss, kLdB, k0, n0, g, t);
                mma_tf32(acc, a, bb);
            }
            const int r0 = m0 + g, c0 = n0 + 2 * t;
            const float v00 = su[r0 * kBV + c0] - acc[0], v01 = su[r0 * kBV + c0 + 1] - acc[1];
            const float v10 = su[(r0 + 8) * kBV + c0] - acc[2], v11 = su[(r0 + 8) * kBV + c0 + 1] - acc[3];
            svn[r0 * kLdB + c0] = v00;
            svn[r0 * kLdB + c0 + 1] = v01;
            svn[(r0 + 8) * kLdB + c0] = v10;
            svn[(r0 + 8) * kLdB + c0 + 1] = v11;
            if (vns != nullptr) {
                float* p = vns + cv_off(d, cb) + y0 + c0;
                *reinterpret_cast<float2*>(p + static_cast<int64_t>(r0) * vd) = make_float2(v00, v01);
                *reinterpret_cast<float2*>(p + static_cast<int64_t>(r0 + 8) * vd) = make_float2(v10, v11);
            }
        }
        __syncthreads();
        if (more) load_wu(n + 1);
        cp_async_commit();
        cp_async_wait<2>();
        __syncthreads();
        // Step 2: O = Qg S + A Vn (A is zero above the diagonal: only k < m0 + 16).
        if (out != nullptr && has_tile) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int k0 = 0; k0 < kd; k0 += 8) {
                uint32_t a[4], bb[2];
                frag_a(a, sq, ldr, m0, k0, g, t);
                frag_b(bb, ss, kLdB, k0, n0, g, t);
                mma_tf32(acc, a, bb);
            }
            for (int k0 = 0; k0 < m0 + 16; k0 += 8) {
                uint32_t a[4], bb[2];
                frag_a(a, sa, lda, m0, k0, g, t);
                frag_b(bb, svn, kLdB, k0, n0, g, t);
                mma_tf32(acc, a, bb);
            }
            const int r0 = m0 + g, c0 = y0 + n0 + 2 * t;
            for (int h2 = 0; h2 < 2; ++h2) {
                const int tok = n * c + r0 + 8 * h2;
                if (tok < d.t) {
                    T* p = out + v_row(d, b, tok, hv) + c0;
                    p[0] = from_f32<T>(acc[2 * h2]);
                    p[1] = from_f32<T>(acc[2 * h2 + 1]);
                }
            }
        }
        __syncthreads();
        if (more) load_qa(n + 1);
        cp_async_commit();
        cp_async_wait<2>();
        __syncthreads();
        // Step 3: S <- Diag(gamma) S + Kg^T Vn, accumulated into the fp32 state.
        for (int tile = warp; tile < (kd / 16) * 2; tile += kWarps) {
            const int x0 = (tile >> 1) * 16, yn = (tile & 1) * 8;
            const int r0 = x0 + g, c0 = yn + 2 * t;
            const float e0 = expf(sg[r0]), e1 = expf(sg[r0 + 8]);
            float acc[4] = {ss[r0 * kLdB + c0] * e0,
                            ss[r0 * kLdB + c0 + 1] * e0,
                            ss[(r0 + 8) * kLdB + c0] * e1,
                            ss[(r0 + 8) * kLdB + c0 + 1] * e1};
            for (int k0 = 0; k0 < c; k0 += 8) {
                uint32_t a[4], bb[2];
                frag_at(a, sk, ldt, x0, k0, g, t);
                frag_b(bb, svn, kLdB, k0, yn, g, t);
                mma_tf32(acc, a, bb);
            }
            // Every warp reads only its own state tile here, so it may overwrite it in place.
            ss[r0 * kLdB + c0] = acc[0];
            ss[r0 * kLdB + c0 + 1] = acc[1];
            ss[(r0 + 8) * kLdB + c0] = acc[2];
            ss[(r0 + 8) * kLdB + c0 + 1] = acc[3];
        }
        __syncthreads();
        if (more) load_kg(n + 1);
        cp_async_commit();
    }
    cp_async_wait<0>();
    if (st != nullptr)
        for (int e = tid; e < kd * kBV; e += blockDim.x) {
            const int x = e / kBV, y = e % kBV;
            st[unit * kv + static_cast<int64_t>(x) * vd + y0 + y] = ss[x * kLdB + y];
        }
}

// Reverse scan: dVn = A^T dO + Kg dS (stored), then dS <- Diag(gamma) dS + Qg^T dO - W^T dVn; dhs gets dS as it
// leaves each chunk, ds0 the final dS.
template <typename T>
__global__ void __launch_bounds__(kThreads) rscan_tc_kernel(const T* __restrict__ dout,
                                                            const float* __restrict__ dst,
                                                            float* __restrict__ ds0,
                                                            Dims d,
                                                            Work w,
                                                            float* dhs,
                                                            float* dvns) {
    extern __shared__ __align__(16) float smem[];
    const int c = d.c, kd = d.k, vd = d.v, tid = threadIdx.x;
    const int unit = blockIdx.y, b = unit / d.hv, hv = unit % d.hv, y0 = blockIdx.x * kBV;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int ldr = ld_row(kd), ldt = ld_tr(kd), lda = ld_tr(c);
    float* sk = smem;              // Kg (row reads)
    float* sq = sk + c * ldr;      // Qg (transposed reads)
    float* sw = sq + c * ldt;      // W (transposed reads)
    float* sa = sw + c * ldt;      // A (transposed reads)
    float* sg = sa + c * lda;      // Gamma of the last row [K]
    float* sds = sg + kd;          // dS [K, kLdB]
    float* sdo = sds + kd * kLdB;  // dO [c, kLdB]
    float* sdvn = sdo + c * kLdB;  // dVn [c, kLdB]
    const int64_t kv = static_cast<int64_t>(kd) * vd;
    for (int e = tid; e < kd * kBV; e += blockDim.x) {
        const int x = e / kBV, y = e % kBV;
        sds[x * kLdB + y] = dst != nullptr ? dst[unit * kv + static_cast<int64_t>(x) * vd + y0 + y] : 0.0f;
    }
    auto load_ka = [&](int n) {
        const int64_t cb = chunk_index(d, unit, n);
        stage_async(sk, ldr, w.kg + ck_off(d, cb), kd, c, kd);
        stage_async(sa, lda, w.a + cc_off(d, cb), c, c, c);
    };
    auto load_qw = [&](int n) {
        const int64_t cb = chunk_index(d, unit, n);
        stage_async(sq, ldt, w.qg + ck_off(d, cb), kd, c, kd);
        stage_async(sw, ldt, w.w + ck_off(d, cb), kd, c, kd);
        stage_async(sg, kd, w.gam + ck_off(d, cb) + static_cast<int64_t>(c - 1) * kd, kd, 1, kd);
    };
    // dO of a chunk: c * 16 values, at most 4 per thread, held in registers until the chunk is reached.
    float dor[4];
    auto load_do = [&](int n) {
        for (int i = 0; i < 4; ++i) {
            const int e = tid + i * kThreads, r = e / kBV, y = e % kBV, tok = n * c + r;
            dor[i] = (r < c && tok < d.t) ? to_f32(dout[v_row(d, b, tok, hv) + y0 + y]) : 0.0f;
        }
    };
    auto store_do = [&] {
        for (int i = 0; i < 4; ++i) {
            const int e = tid + i * kThreads, r = e / kBV, y = e % kBV;
            if (r < c) sdo[r * kLdB + y] = dor[i];
        }
    };
    const int last = d.nc - 1;
    load_ka(last);
    cp_async_commit();
    load_qw(last);
    cp_async_commit();
    load_do(last);
    store_do();
    const int mt = warp >> 1, nt = warp & 1, m0 = mt * 16, n0 = nt * 8;
    const bool has_tile = m0 < c;
    for (int n = last; n >= 0; --n) {
        const int64_t cb = chunk_index(d, unit, n);
        const bool more = n > 0;
        if (more) load_do(n - 1);
        cp_async_wait<1>();
        __syncthreads();
        for (int e = tid; e < kd * kBV; e += blockDim.x) {
            const int x = e / kBV, y = e % kBV;
            dhs[cb * kv + static_cast<int64_t>(x) * vd + y0 + y] = sds[x * kLdB + y];
        }
        // Step 1: dVn = A^T dO + Kg dS (A^T is zero below the diagonal: only k >= m0).
        if (has_tile) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int k0 = m0; k0 < c; k0 += 8) {
                uint32_t a[4], bb[2];
                frag_at(a, sa, lda, m0, k0, g, t);
                frag_b(bb, sdo, kLdB, k0, n0, g, t);
                mma_tf32(acc, a, bb);
            }
            for (int k0 = 0; k0 < kd; k0 += 8) {
                uint32_t a[4], bb[2];
                frag_a(a, sk, ldr, m0, k0, g, t);
                frag_b(bb, sds, kLdB, k0, n0, g, t);
                mma_tf32(acc, a, bb);
            }
            const int r0 = m0 + g, c0 = n0 + 2 * t;
            sdvn[r0 * kLdB + c0] = acc[0];
            sdvn[r0 * kLdB + c0 + 1] = acc[1];
            sdvn[(r0 + 8) * kLdB + c0] = acc[2];
            sdvn[(r0 + 8) * kLdB + c0 + 1] = acc[3];
            float* p = dvns + cv_off(d, cb) + y0 + c0;
            *reinterpret_cast<float2*>(p + static_cast<int64_t>(r0) * vd) = make_float2(acc[0], acc[1]);
            *reinterpret_cast<float2*>(p + static_cast<int64_t>(r0 + 8) * vd) = make_float2(acc[2], acc[3]);
        }
        __syncthreads();
        if (more) load_ka(n - 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        // Step 2: dS <- Diag(gamma) dS + Qg^T dO - W^T dVn, into the fp32 dS.
        for (int tile = warp; tile < (kd / 16) * 2; tile += kWarps) {
            const int x0 = (tile >> 1) * 16, yn = (tile & 1) * 8;
            const int r0 = x0 + g, c0 = yn + 2 * t;
            const float e0 = expf(sg[r0]), e1 = expf(sg[r0 + 8]);
            float acc[4] = {sds[r0 * kLdB + c0] * e0,
                            sds[r0 * kLdB + c0 + 1] * e0,
                            sds[(r0 + 8) * kLdB + c0] * e1,
                            sds[(r0 + 8) * kLdB + c0 + 1] * e1};
            for (int k0 = 0; k0 < c; k0 += 8) {
                uint32_t a[4], bb[2];
                frag_at(a, sq, ldt, x0, k0, g, t);
                frag_b(bb, sdo, kLdB, k0, yn, g, t);
                mma_tf32(acc, a, bb);
                frag_at(a, sw, ldt, x0, k0, g, t);
                frag_b_neg(bb, sdvn, kLdB, k0, yn, g, t);
                mma_tf32(acc, a, bb);
            }
            sds[r0 * kLdB + c0] = acc[0];
            sds[r0 * kLdB + c0 + 1] = acc[1];
            sds[(r0 + 8) * kLdB + c0] = acc[2];
            sds[(r0 + 8) * kLdB + c0 + 1] = acc[3];
        }
        __syncthreads();
        if (more) {
            load_qw(n - 1);
            store_do();  // dO of chunk n is no longer read
        }
        cp_async_commit();
    }
    cp_async_wait<0>();
    if (ds0 != nullptr)
        for (int e = tid; e < kd * kBV; e += blockDim.x) {
            const int x = e / kBV, y = e % kBV;
            ds0[unit * kv + static_cast<int64_t>(x) * vd + y0 + y] = sds[x * kLdB + y];
        }
}

template <typename K>
void set_smem(K kernel, size_t bytes) {
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace

bool use_tc(const Dims& d, DType dt) {
    static const bool off = [] {
        const char* e = std::getenv("MT_KDA_TC");
        return e != nullptr && std::string_view(e) == "0";
    }();
    return !off && dt != DType::f32 && d.k % 16 == 0 && d.k <= 128 && d.v % kBV == 0;
}

void scan_tc_launch(DType dt,
                    const Tensor& s0,
                    const Tensor& out,
                    const Tensor& st,
                    const Dims& d,
                    const Work& w,
                    float* hs,
                    float* vn) {
    const dim3 grid(static_cast<unsigned>(d.v / kBV), static_cast<unsigned>(d.units()));
    const float* s0p = s0.defined() ? s0.data<float>() : nullptr;
    float* stp = st.defined() ? st.data<float>() : nullptr;
    const size_t smem = static_cast<size_t>(scan_tc_floats(d)) * sizeof(float);
    MT_CUDA_DISPATCH(dt, T, {
        T* op = out.defined() ? static_cast<T*>(out.raw()) : nullptr;
        set_smem(scan_tc_kernel<T>, smem);
        scan_tc_kernel<T><<<grid, kThreads, smem, core::cuda_stream()>>>(s0p, op, stp, d, w, hs, vn);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}

void rscan_tc_launch(
    const Tensor& dout, const Tensor& dst, const Tensor& ds0, const Dims& d, const Work& w, float* dhs, float* dvn) {
    const dim3 grid(static_cast<unsigned>(d.v / kBV), static_cast<unsigned>(d.units()));
    const float* dstp = dst.defined() ? dst.data<float>() : nullptr;
    float* ds0p = ds0.defined() ? ds0.data<float>() : nullptr;
    const size_t smem = static_cast<size_t>(rscan_tc_floats(d)) * sizeof(float);
    MT_CUDA_DISPATCH(dout.dtype(), T, {
        set_smem(rscan_tc_kernel<T>, smem);
        rscan_tc_kernel<T><<<grid, kThreads, smem, core::cuda_stream()>>>(
            static_cast<const T*>(dout.raw()), dstp, ds0p, d, w, dhs, dvn);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::ops::cuda::kda
