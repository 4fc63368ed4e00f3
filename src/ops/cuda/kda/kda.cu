// CUDA KDA forward (kda.md §4.1, §4.5), a first straightforward version: fp32 math and an fp32 workspace, inputs
// bf16, f16 or f32, fp32 states. Two kernels:
//   prep: one block per (chunk, unit), all chunks in parallel: Gamma, Qg, Kg, Xw, A, M, T = (I + L)^-1 (column-wise
//         forward substitution), W = T Xw, U = T Diag(beta) V.
//   scan: one block per (16 value columns, unit): the chunks in order, state columns in shared memory (the columns
//         of S never mix): Vn = U - W S, O = Qg S + A Vn, S <- Diag(gamma) S + Kg^T Vn.
// Every intra-chunk decay factor is formed per entry as e^(Gamma_i - Gamma_j) <= 1 (the pairwise form, valid for
// either gate), so both KdaDiagonal choices run the same kernels. No atomics: every output has one writer.
#include "ops/cuda/kda/kda_common.cuh"
#include "ops/cuda/kda/kda_mma.cuh"
#include "ops/kda.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace kda {

namespace {

template <typename T>
__global__ void __launch_bounds__(kThreads) prep_kernel(const T* __restrict__ q,
                                                        const T* __restrict__ k,
                                                        const T* __restrict__ v,
                                                        const T* __restrict__ g,
                                                        const T* __restrict__ beta,
                                                        Dims d,
                                                        Work w) {
    __shared__ float sbeta[kMaxChunk];
    __shared__ float sl[kMaxChunk * kMaxChunk];  // L = Diag(beta) M
    __shared__ float st[kMaxChunk * kMaxChunk];  // T
    const int n = blockIdx.x, unit = blockIdx.y, b = unit / d.hv, hv = unit % d.hv, h = hv / d.group;
    const int c = d.c, kd = d.k, vd = d.v, tid = threadIdx.x, t0 = n * c;
    const int64_t cb = chunk_index(d, unit, n);
    float* gam = w.gam + ck_off(d, cb);  // [c, kd]
    float* qg = w.qg + ck_off(d, cb);
    float* kg = w.kg + ck_off(d, cb);
    float* xw = w.xw + ck_off(d, cb);
    float* ww = w.w + ck_off(d, cb);
    float* uu = w.u + cv_off(d, cb);  // [c, vd]
    float* a = w.a + cc_off(d, cb);   // [c, c]
    float* m = w.m + cc_off(d, cb);
    float* tm = w.tm + cc_off(d, cb);
    for (int r = tid; r < c; r += blockDim.x) sbeta[r] = ld(beta, beta_at(d, b, t0 + r, hv), t0 + r < d.t);
    __syncthreads();
    // Gamma (cumsum down each key column), then the decayed rows.
    for (int x = tid; x < kd; x += blockDim.x) {
        float acc = 0.0f;
        for (int r = 0; r < c; ++r) {
            const int t = t0 + r;
            acc += ld(g, g_row(d, b, t, hv) + x, t < d.t);
            gam[r * kd + x] = acc;
        }
        const float last = acc;
        for (int r = 0; r < c; ++r) {
            const int t = t0 + r;
            const bool ok = t < d.t;
            const float qv = ld(q, qk_row(d, b, t, h) + x, ok), kv = ld(k, qk_row(d, b, t, h) + x, ok);
            const float e = expf(gam[r * kd + x]);
            qg[r * kd + x] = qv * e;
            kg[r * kd + x] = kv * expf(last - gam[r * kd + x]);
            xw[r * kd + x] = sbeta[r] * kv * e;
        }
    }
    __syncthreads();
    // A_ij = sum q_i k_j e^(G_i - G_j) (i >= j), M_ij = sum k_i k_j e^(G_i - G_j) (i > j): one warp per entry, the
    // lanes over the key channels.
    const int warp = tid / 32, lane = tid % 32, warps = blockDim.x / 32;
    for (int e = warp; e < c * c; e += warps) {
        const int i = e / c, j = e % c;
        float sa = 0.0f, sm = 0.0f;
        if (j <= i && t0 + i < d.t) {
            const int64_t qi = qk_row(d, b, t0 + i, h), kj = qk_row(d, b, t0 + j, h);
            for (int x = lane; x < kd; x += 32) {
                const float f = expf(gam[i * kd + x] - gam[j * kd + x]);
                const float kjx = to_f32(k[kj + x]) * f;
                sa += to_f32(q[qi + x]) * kjx;
                sm += to_f32(k[qi + x]) * kjx;
            }
            sa = warp_sum(sa);
            sm = warp_sum(sm);
        }
        if (j >= i) sm = 0.0f;
        if (lane == 0) {
            a[e] = sa;
            m[e] = sm;
            sl[e] = sbeta[i] * sm;
        }
    }
    __syncthreads();
    // T = (I + L)^-1, column j by forward substitution: T_ij = -sum_{j <= x < i} L_ix T_xj.
    for (int j = tid; j < c; j += blockDim.x) {
        for (int i = 0; i < j; ++i) st[i * c + j] = 0.0f;
        st[j * c + j] = 1.0f;
        for (int i = j + 1; i < c; ++i) {
            float acc = 0.0f;
            for (int x = j; x < i; ++x) acc += sl[i * c + x] * st[x * c + j];
            st[i * c + j] = -acc;
        }
    }
    __syncthreads();
    for (int e = tid; e < c * c; e += blockDim.x) tm[e] = st[e];
    // W = T Xw, U = T Diag(beta) V.
    for (int e = tid; e < c * kd; e += blockDim.x) {
        const int i = e / kd, x = e % kd;
        float acc = 0.0f;
        for (int j = 0; j <= i; ++j) acc += st[i * c + j] * xw[j * kd + x];
        ww[e] = acc;
    }
    for (int e = tid; e < c * vd; e += blockDim.x) {
        const int i = e / vd, y = e % vd;
        float acc = 0.0f;
        for (int j = 0; j <= i; ++j) {
            const int t = t0 + j;
            acc += st[i * c + j] * (sbeta[j] * ld(v, v_row(d, b, t, hv) + y, t < d.t));
        }
        uu[e] = acc;
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) scan_kernel(
    const float* __restrict__ s0, T* __restrict__ out, float* __restrict__ st, Dims d, Work w, float* hs, float* vns) {
    const int unit = blockIdx.y, b = unit / d.hv, hv = unit % d.hv, y0 = blockIdx.x * kBV, tid = threadIdx.x;
    const int c = d.c, kd = d.k, vd = d.v, bv = min(kBV, vd - y0);
    extern __shared__ float smem[];
    float* s = smem;                           // [kd, kBV] state columns
    float* svn = s + kd * kBV;                 // [c, kBV]
    float* tile = svn + kMaxChunk * kBV;       // [c, kd]: W, then Qg, then Kg of the chunk
    float* sa = tile + kMaxChunk * kd;         // [c, c] A
    float* sgam = sa + kMaxChunk * kMaxChunk;  // [kd] gamma = e^(Gamma_last)
    const int64_t kv = static_cast<int64_t>(kd) * vd;
    for (int e = tid; e < kd * kBV; e += blockDim.x) {
        const int x = e / kBV, yl = e % kBV;
        s[e] = (s0 != nullptr && yl < bv) ? s0[unit * kv + static_cast<int64_t>(x) * vd + y0 + yl] : 0.0f;
    }
    __syncthreads();
    for (int n = 0; n < d.nc; ++n) {
        const int64_t cb = chunk_index(d, unit, n);
        const float* gam = w.gam + ck_off(d, cb);
        const float* uu = w.u + cv_off(d, cb);
        if (chunk_resets(d, w, unit, n)) {  // a document starts here: its state starts from zero
            for (int e = tid; e < kd * kBV; e += blockDim.x) s[e] = 0.0f;
            __syncthreads();
        }
        if (hs != nullptr)
            for (int e = tid; e < kd * bv; e += blockDim.x) {
                const int x = e / bv, yl = e % bv;
                hs[cb * kv + static_cast<int64_t>(x) * vd + y0 + yl] = s[x * kBV + yl];
            }
        stage(tile, w.w + ck_off(d, cb), c * kd);
        stage(sa, w.a + cc_off(d, cb), c * c);
        for (int x = tid; x < kd; x += blockDim.x) sgam[x] = expf(gam[(c - 1) * kd + x]);
        __syncthreads();
        // Vn = U - W S
        for (int e = tid; e < c * kBV; e += blockDim.x) {
            const int i = e / kBV, yl = e % kBV;
            if (yl >= bv) continue;
            float acc = 0.0f;
            for (int x = 0; x < kd; ++x) acc += tile[i * kd + x] * s[x * kBV + yl];
            const float vn = uu[i * vd + y0 + yl] - acc;
            svn[e] = vn;
            if (vns != nullptr) vns[cv_off(d, cb) + static_cast<int64_t>(i) * vd + y0 + yl] = vn;
        }
        __syncthreads();
        // O = Qg S + A Vn
        if (out != nullptr) {
            stage(tile, w.qg + ck_off(d, cb), c * kd);
            __syncthreads();
            for (int e = tid; e < c * kBV; e += blockDim.x) {
                const int i = e / kBV, yl = e % kBV, t = n * c + i;
                if (yl >= bv || t >= d.t) continue;
                float acc = 0.0f;
                for (int x = 0; x < kd; ++x) acc += tile[i * kd + x] * s[x * kBV + yl];
                float acc2 = 0.0f;
                for (int j = 0; j <= i; ++j) acc2 += sa[i * c + j] * svn[j * kBV + yl];
                out[v_row(d, b, t, hv) + y0 + yl] = from_f32<T>(acc + acc2);
            }
            __syncthreads();
        }
        // S <- Diag(gamma) S + Kg^T Vn
        stage(tile, w.kg + ck_off(d, cb), c * kd);
        __syncthreads();
        for (int e = tid; e < kd * kBV; e += blockDim.x) {
            const int x = e / kBV, yl = e % kBV;
            if (yl >= bv) continue;
            float acc = 0.0f;
            for (int i = 0; i < c; ++i) acc += tile[i * kd + x] * svn[i * kBV + yl];
            s[e] = s[e] * sgam[x] + acc;
        }
        __syncthreads();
    }
    if (st != nullptr)
        for (int e = tid; e < kd * bv; e += blockDim.x) {
            const int x = e / bv, yl = e % bv;
            st[unit * kv + static_cast<int64_t>(x) * vd + y0 + yl] = s[x * kBV + yl];
        }
}

}  // namespace

Work work_alloc(const Dims& d, std::vector<Tensor>& keep, bool scan_only, const Work& given, bool with_u) {
    const int64_t chunks = static_cast<int64_t>(d.units()) * d.nc;
    auto alloc = [&](int64_t cols) {
        keep.push_back(Tensor::scratch({chunks * d.c * cols}, DType::f32, core::Device::cuda));
        return keep.back().data<float>();
    };
    auto pick = [&](float* g, int64_t cols, bool wanted) {
        return g != nullptr ? g : (wanted ? alloc(cols) : nullptr);
    };
    Work w{};
    w.gam = pick(given.gam, d.k, true);
    w.qg = pick(given.qg, d.k, true);
    w.kg = pick(given.kg, d.k, true);
    w.xw = pick(given.xw, d.k, !scan_only);
    w.w = pick(given.w, d.k, true);
    w.u = pick(given.u, d.v, with_u);
    w.a = pick(given.a, d.c, true);
    w.m = pick(given.m, d.c, !scan_only);
    w.tm = pick(given.tm, d.c, !scan_only);
    return w;
}

void prep_launch(const Tensor& q,
                 const Tensor& k,
                 const Tensor& v,
                 const Tensor& g,
                 const Tensor& beta,
                 const Dims& d,
                 const Work& w) {
    const dim3 grid(static_cast<unsigned>(d.nc), static_cast<unsigned>(d.units()));
    MT_CUDA_DISPATCH(q.dtype(), T, {
        prep_kernel<T><<<grid, kThreads, 0, core::exec_stream()>>>(static_cast<const T*>(q.raw()),
                                                                   static_cast<const T*>(k.raw()),
                                                                   static_cast<const T*>(v.raw()),
                                                                   static_cast<const T*>(g.raw()),
                                                                   static_cast<const T*>(beta.raw()),
                                                                   d,
                                                                   w);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}

void scan_launch(
    const Tensor& s0, const Tensor& out, const Tensor& st, const Dims& d, const Work& w, float* hs, float* vn) {
    const dim3 grid(static_cast<unsigned>((d.v + kBV - 1) / kBV), static_cast<unsigned>(d.units()));
    const float* s0p = s0.defined() ? s0.data<float>() : nullptr;
    float* stp = st.defined() ? st.data<float>() : nullptr;
    const DType dt = out.defined() ? out.dtype() : DType::f32;
    const size_t smem = scan_smem_bytes(d);
    MT_CUDA_DISPATCH(dt, T, {
        T* op = out.defined() ? static_cast<T*>(out.raw()) : nullptr;
        MT_CUDA_CHECK(
            cudaFuncSetAttribute(scan_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        scan_kernel<T><<<grid, kThreads, smem, core::exec_stream()>>>(s0p, op, stp, d, w, hs, vn);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kda

namespace kda {

Plan make_plan(const Dims& d, DType dt, const ops::KdaKernels& kernels) {
    Plan p;
    p.tc = kernels.tensor_cores && tc_shapes(d, dt);
    p.chunk_tc = p.tc && chunk_tc_shapes(d);
    p.chunk_smem = p.chunk_tc && kernels.chunk_smem && chunk_smem_shapes(d);
    if (p.tc) {
        p.scan_bv = scan_tile(d, kernels.scan_bv);
        p.rscan_bv = rscan_tile(d, kernels.rscan_bv);
    }
    return p;
}

std::string plan_name(const Plan& p, bool backward) {
    if (!p.tc) return "cuda-fp32";
    std::string s = "cuda-tc scan_bv=" + std::to_string(p.scan_bv);
    if (backward) {
        s += " rscan_bv=" + std::to_string(p.rscan_bv);
        s += p.chunk_smem ? " chunk=smem" : (p.chunk_tc ? " chunk=tc" : " chunk=general");
    }
    return s;
}

}  // namespace kda

kda::Dims kda_dims(const Tensor& q, const Tensor& v, int64_t chunk) {
    kda::Dims d{};
    d.b = static_cast<int>(q.size(0));
    d.t = static_cast<int>(q.size(1));
    d.h = static_cast<int>(q.size(2));
    d.hv = static_cast<int>(v.size(2));
    d.k = static_cast<int>(q.size(3));
    d.v = static_cast<int>(v.size(3));
    d.c = static_cast<int>(chunk);
    d.nc = (d.t + d.c - 1) / d.c;
    d.group = d.hv / d.h;
    return d;
}

void kda_check_dtypes(const Tensor& q,
                      const Tensor& k,
                      const Tensor& v,
                      const Tensor& g,
                      const Tensor& beta,
                      std::initializer_list<NamedArg> like_q,
                      std::initializer_list<NamedArg> states,
                      int64_t chunk,
                      std::string_view op) {
    check_cuda_float(q, op, "q");
    check_dtype_as(k, q, op, "k", "q");
    check_dtype_as(v, q, op, "v", "q");
    check_dtype_as(g, q, op, "g", "q");
    check_dtype_as(beta, q, op, "beta", "q");
    for (const NamedArg& a : like_q)
        if (a.tensor.defined()) check_dtype_as(a.tensor, q, op, a.name, "q");
    for (const NamedArg& a : states)
        if (a.tensor.defined()) check_f32(a.tensor, op, a.name);
    MT_CHECK(chunk == 64 || chunk == 32, "{}: chunk_size = {}; the CUDA path takes 64 or 32", op, chunk);
    MT_CHECK(q.size(0) * v.size(2) <= 65535,
             "{}: B * HV = {} exceeds the CUDA path's grid limit of 65535",
             op,
             q.size(0) * v.size(2));
    MT_CHECK(q.size(0) * q.size(1) * v.size(2) < (int64_t{1} << 31) / 64,
             "{}: B * T * HV = {} is too large for the CUDA path's 32-bit row indices",
             op,
             q.size(0) * q.size(1) * v.size(2));
}

void kda_fwd(const Tensor& q,
             const Tensor& k,
             const Tensor& v,
             const Tensor& g,
             const Tensor& beta,
             const Tensor& s0,
             const Tensor& out,
             const Tensor& st,
             const ops::KdaOptions& options,
             ops::KdaSaved* saved) {
    constexpr std::string_view op = "kda_fwd";
    kda_check_dtypes(q, k, v, g, beta, {{"out", out}}, {{"s0", s0}, {"st", st}}, options.chunk_size, op);
    core::NvtxRange range("kda_fwd");
    kda::Profile prof("fwd");
    const kda::Dims d = kda_dims(q, v, options.chunk_size);
    std::vector<Tensor> keep_alive;
    // prep_tc's forward writes only what the scan reads: no Xw, M, T (their zero-filled allocation cost ~0.15 ms
    // at 8 x 4096), unless the caller keeps them for the backward (ops::KdaSaved): then the kept quantities go
    // straight to its tensors.
    const kda::Plan plan = kda::make_plan(d, q.dtype(), options.kernels);
    if (options.chosen != nullptr) *options.chosen = kda::plan_name(plan, false);
    const bool tc = plan.tc;
    // save_states_bf16 keeps the states alone, read back only by chunk_mm_tc (plan.chunk_tc); elsewhere nothing.
    const bool keep16 = saved != nullptr && tc && options.save_states_bf16 && plan.chunk_tc;
    const bool keep = saved != nullptr && tc && !options.save_states_bf16;
    const bool keep_ws = keep && options.save_workspace, keep_states = keep && (options.save_states || keep_ws);
    kda::Work given{};
    const int64_t chunks = static_cast<int64_t>(d.units()) * d.nc;
    auto alloc = [&](Tensor& t, DType dt, int64_t rows, int64_t cols) {  // [chunks, rows, cols]
        t = Tensor::scratch({chunks * rows * cols}, dt, core::Device::cuda);
        return t.raw();
    };
    if (keep16) {
        alloc(saved->hs, DType::bf16, d.k, d.v);
        alloc(saved->vn, DType::bf16, d.c, d.v);
    }
    if (keep) {
        auto f32 = [&](Tensor& t, int64_t rows, int64_t cols) {
            return static_cast<float*>(alloc(t, DType::f32, rows, cols));
        };
        given.a = f32(saved->a, d.c, d.c);
        given.m = f32(saved->m, d.c, d.c);
        given.tm = f32(saved->t, d.c, d.c);
        if (keep_states) {
            f32(saved->hs, d.k, d.v);
            f32(saved->vn, d.c, d.v);
        }
        if (keep_ws) {
            given.gam = f32(saved->gam, d.c, d.k);
            given.qg = f32(saved->qg, d.c, d.k);
            given.kg = f32(saved->kg, d.c, d.k);
            given.w = f32(saved->w, d.c, d.k);
        }
    }
    kda::Work w = kda::work_alloc(d, keep_alive, tc, given);
    w.reset = options.chunk_reset.defined() ? options.chunk_reset.data<int32_t>() : nullptr;
    prof.mark("alloc");
    if (tc)
        kda::prep_tc_launch(q, k, v, g, beta, d, w, keep_ws ? kda::PrepMode::fwd_all : kda::PrepMode::fwd);
    else
        kda::prep_launch(q, k, v, g, beta, d, w);
    prof.mark("prep");
    if (tc) {
        kda::StatesOut kept;
        if (keep_states) kept = {saved->hs.data<float>(), saved->vn.data<float>(), nullptr, nullptr};
        if (keep16) kept = {nullptr, nullptr, static_cast<bf16*>(saved->hs.raw()), static_cast<bf16*>(saved->vn.raw())};
        kda::scan_tc_launch(q.dtype(), s0, out, st, d, w, kept, plan.scan_bv);
    } else {
        kda::scan_launch(s0, out, st, d, w, nullptr, nullptr);
    }
    prof.mark("scan");
}
MT_REGISTER_KERNEL(kda_fwd, cuda, kda_fwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
