// CUDA Newton-Schulz orthogonalisation (ops/muon.h, muon.md §1) of a stack [E, A, B]: the products run as bf16
// strided-batched cuBLASLt GEMMs with fp32 accumulation (CUBLAS_COMPUTE_32F), three per step over all E matrices at
// once, each folding its linear term into the epilogue (beta):
//   G = X X^T;   P = c G G + b G   (C = G);   X' = a X + P X   (C = X)
// Before them, each matrix is divided by its Frobenius norm + 1e-7 (f64 block partials, one fixed-order pass per
// matrix) and rounded to bf16; after them, the last iterate is widened to out's dtype (or is out itself, when out is
// bf16 with no padding between its matrices). Row-major [A, B] matrices are column-major B x A ones to cuBLASLt, so
// the input's layout already holds X (p x q, p = min(A, B)) column-major when A > B and X^T when A <= B: the GEMMs
// take the transposition through their op flags and no pass moves data:
//   A <= B (S = X^T, q x p):  G = S^T S;  X'^T = a S + S P^T
//   A >  B (S = X,   p x q):  G = S S^T;  X'   = a S + P S
// x, out: [E, A, B] bf16|f16|f32, one dtype. The algorithm is chosen once per shape, batch and alignment and the
// reductions have a fixed order, so the op is deterministic.
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "core/backend.h"
#include "core/cuda/cuda_check.h"
#include "ops/cuda/gemm/cublaslt_util.cuh"
#include "ops/cuda/gemm/muon_newton_schulz.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

using core::Device;
using muon::chunk_range;
using muon::ChunkRange;
using muon::kChunk;
using muon::kThreads;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

void lt_check(cublasStatus_t status, const char* what) {
    lt::check(status, what, "newton_schulz");
}

// The alignment cuBLASLt may assume for every matrix of a strided batch: that of the first one's address and of the
// stride in bytes.
uint32_t batch_alignment(const void* ptr, int64_t stride) {
    const auto addr = reinterpret_cast<uintptr_t>(ptr) | static_cast<uintptr_t>(stride * sizeof(bf16));
    return lt::alignment_of(reinterpret_cast<const void*>(addr));
}

// One strided-batched GEMM D = alpha op(A) op(B) + beta C in cuBLASLt's column-major terms (m x n output, k the
// reduced dimension), every operand bf16; C has D's layout.
struct BatchedGemm {
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldd;
    int64_t stride_a, stride_b, stride_d;
    int32_t batch;
    uint32_t align_a, align_b, align_d;  // align_d covers C as well
    auto key() const {
        return std::make_tuple(
            ta, tb, m, n, k, lda, ldb, ldd, stride_a, stride_b, stride_d, batch, align_a, align_b, align_d);
    }
};

struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
};

class NsContext {
   public:
    static NsContext& get() {
        static NsContext* ctx = new NsContext();  // never destroyed: it may outlive the CUDA context at exit
        return *ctx;
    }

    void matmul(const BatchedGemm& g, float alpha, const bf16* a, const bf16* b, float beta, const bf16* c, bf16* d) {
        std::lock_guard<std::mutex> lock(mutex_);
        const Plan& plan = plan_for(g);
        lt_check(cublasLtMatmul(handle_,
                                plan.desc,
                                &alpha,
                                a,
                                plan.a,
                                b,
                                plan.b,
                                &beta,
                                c,
                                plan.d,
                                d,
                                plan.d,
                                &plan.algo,
                                workspace_[core::exec().lane == core::Lane::main ? 0 : 1],
                                kWorkspaceBytes,
                                core::exec_stream()),
                 "cublasLtMatmul");
    }

   private:
    NsContext() {
        lt_check(cublasLtCreate(&handle_), "cublasLtCreate");
        for (void*& w : workspace_) w = core::backend_get(Device::cuda).alloc(kWorkspaceBytes);
    }

    static cublasLtMatrixLayout_t layout(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int32_t batch) {
        cublasLtMatrixLayout_t l = nullptr;
        lt_check(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, rows, cols, ld), "layout");
        lt_check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)),
                 "batch count");
        lt_check(
            cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
            "batch stride");
        return l;
    }

    const Plan& plan_for(const BatchedGemm& g) {
        auto it = plans_.find(g.key());
        if (it != plans_.end()) return it->second;
        Plan p;
        lt_check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
        const cublasOperation_t ta = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
        lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
        // Stored (not transposed) shapes: A is m x k (k x m when transposed), B is k x n (n x k).
        p.a = layout(g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.lda, g.stride_a, g.batch);
        p.b = layout(g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.ldb, g.stride_b, g.batch);
        p.d = layout(g.m, g.n, g.ldd, g.stride_d, g.batch);
        cublasLtMatmulPreference_t pref = nullptr;
        lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
        const uint64_t ws = kWorkspaceBytes;
        lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                 "workspace preference");
        const uint32_t aligns[] = {g.align_a, g.align_b, g.align_d, g.align_d};
        const cublasLtMatmulPreferenceAttributes_t attrs[] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; ++i)
            lt_check(cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &aligns[i], sizeof(uint32_t)),
                     "alignment preference");
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        const cublasStatus_t st =
            cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
        cublasLtMatmulPreferenceDestroy(pref);
        if (st != CUBLAS_STATUS_SUCCESS || found == 0)
            core::fail(core::ExitCode::device,
                       "cuBLASLt has no algorithm for a batch of {} {}x{}x{} bf16 GEMMs (status {})",
                       g.batch,
                       g.m,
                       g.n,
                       g.k,
                       static_cast<int>(st));
        p.algo = result.algo;
        return plans_.emplace(g.key(), p).first->second;
    }

    std::mutex mutex_;
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_[2] = {};  // one per lane (core/exec.h), as linear.cu's
    std::map<decltype(BatchedGemm{}.key()), Plan> plans_;
};

// partial[block] = the sum of x^2 over the block's chunk (f64).
template <int VEC, typename T>
__global__ void sq_partial_kernel(const T* __restrict__ x, int64_t n, int64_t chunks, double* __restrict__ partial) {
    const ChunkRange r = chunk_range(n, chunks);
    const T* xe = x + r.e * n;
    double sq = 0.0;
    for (int64_t i = r.begin + static_cast<int64_t>(threadIdx.x) * VEC; i < r.end; i += blockDim.x * VEC) {
        float v[VEC];
        load_vec<VEC>(xe + i, v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) sq += static_cast<double>(v[k]) * static_cast<double>(v[k]);
    }
    __shared__ double scratch[32];
    sq = block_sum(sq, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = sq;
}

// x0 (the padded bf16 layout) = x inv[e].
template <int VEC, typename T>
__global__ void scale_kernel(const T* __restrict__ x,
                             int64_t n,
                             int64_t chunks,
                             int64_t stride,
                             const float* __restrict__ inv,
                             bf16* __restrict__ x0) {
    const ChunkRange r = chunk_range(n, chunks);
    const float s = inv[r.e];
    for (int64_t i = r.begin + static_cast<int64_t>(threadIdx.x) * VEC; i < r.end; i += blockDim.x * VEC) {
        float v[VEC];
        load_vec<VEC>(x + r.e * n + i, v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] *= s;
        store_vec<VEC>(x0 + r.e * stride + i, v);
    }
}

// out = the last iterate (padded bf16 layout), widened to out's dtype.
template <int VEC, typename T>
__global__ void unpack_kernel(
    const bf16* __restrict__ xk, int64_t n, int64_t chunks, int64_t stride, T* __restrict__ out) {
    const ChunkRange r = chunk_range(n, chunks);
    for (int64_t i = r.begin + static_cast<int64_t>(threadIdx.x) * VEC; i < r.end; i += blockDim.x * VEC) {
        float v[VEC];
        load_vec<VEC>(xk + r.e * stride + i, v);
        store_vec<VEC>(out + r.e * n + i, v);
    }
}

// Block e: inv[e] = 1 / (sqrt(its chunks' partials summed in a fixed order) + 1e-7).
__global__ void inv_norm_kernel(const double* __restrict__ partial, int64_t chunks, float* __restrict__ inv) {
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) s += partial[blockIdx.x * chunks + c];
    __shared__ double scratch[32];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) inv[blockIdx.x] = static_cast<float>(1.0 / (sqrt(s) + 1e-7));
}

// One block: *dst += the partials in a fixed order.
__global__ void add_sum_kernel(const double* __restrict__ partial, int64_t count, double* __restrict__ dst) {
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
    __shared__ double scratch[32];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) *dst += s;
}

// One block per matrix: dst[e] += matrix e's partials (its chunks) in a fixed order.
__global__ void add_sums_kernel(const double* __restrict__ partial, int64_t chunks, double* __restrict__ dst) {
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) s += partial[blockIdx.x * chunks + c];
    __shared__ double scratch[32];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) dst[blockIdx.x] += s;
}

int64_t round_up(int64_t v, int64_t to) {
    return (v + to - 1) / to * to;
}

}  // namespace

namespace muon {

Layout layout_of(const Tensor& t) {
    Layout l;
    l.e = t.size(0), l.a = t.size(1), l.b = t.size(2);
    l.n = l.a * l.b;
    l.chunks = std::max<int64_t>(1, (l.n + kChunk - 1) / kChunk);
    l.tall = l.a > l.b;
    l.p = std::min(l.a, l.b), l.q = std::max(l.a, l.b);
    l.x_stride = round_up(l.n, 16);
    l.g_stride = round_up(l.p * l.p, 16);
    MT_CHECK(l.e <= INT32_MAX && l.blocks() <= INT32_MAX,
             "newton_schulz: a stack of {} matrices of {} x {} is too large for one batched call",
             l.e,
             l.a,
             l.b);
    return l;
}

void launch_inv_norm(const Layout& l, const double* partial, float* inv) {
    inv_norm_kernel<<<static_cast<unsigned>(l.e), kThreads, 0, core::exec_stream()>>>(partial, l.chunks, inv);
    MT_CUDA_CHECK(cudaGetLastError());
}

void launch_add_sum(const double* partial, int64_t count, double* dst) {
    add_sum_kernel<<<1, kThreads, 0, core::exec_stream()>>>(partial, count, dst);
    MT_CUDA_CHECK(cudaGetLastError());
}

void launch_add_sums(const Layout& l, const double* partial, double* dst) {
    add_sums_kernel<<<static_cast<unsigned>(l.e), kThreads, 0, core::exec_stream()>>>(partial, l.chunks, dst);
    MT_CUDA_CHECK(cudaGetLastError());
}

bf16* iterate(const Layout& l, const MuonHyper& hyper, bf16* buf0, bf16* buf1) {
    const Tensor gram_t = Tensor::scratch({l.e * l.g_stride}, DType::bf16, Device::cuda);
    const Tensor poly_t = Tensor::scratch({l.e * l.g_stride}, DType::bf16, Device::cuda);
    auto* gram = static_cast<bf16*>(gram_t.raw());
    auto* poly = static_cast<bf16*>(poly_t.raw());
    const int64_t p = l.p, q = l.q, sx = l.x_stride, sg = l.g_stride;
    const auto batch = static_cast<int32_t>(l.e);
    const uint32_t ag = batch_alignment(gram, sg), ap = batch_alignment(poly, sg);
    NsContext& ctx = NsContext::get();
    bf16* buf[2] = {buf0, buf1};
    const int steps = hyper.total_steps();
    for (int k = 0; k < steps; ++k) {
        double a = 0, b = 0, c = 0;
        hyper.coeffs(k, a, b, c);
        bf16 *cur = buf[k % 2], *next = buf[(k + 1) % 2];
        const uint32_t ac = batch_alignment(cur, sx), an = std::min(ac, batch_alignment(next, sx));
        // G = X X^T: S^T S (S = X^T stored q x p) or S S^T (S = X stored p x q).
        const int64_t ld = l.tall ? p : q;
        ctx.matmul(
            {!l.tall, l.tall, p, p, q, ld, ld, p, sx, sx, sg, batch, ac, ac, ag}, 1.0f, cur, cur, 0.0f, gram, gram);
        // P = c G G + b G.
        ctx.matmul({false, false, p, p, p, p, p, p, sg, sg, sg, batch, ag, ag, std::min(ag, ap)},
                   static_cast<float>(c),
                   gram,
                   gram,
                   static_cast<float>(b),
                   gram,
                   poly);
        // X' = a X + P X: S' = a S + S P^T (q x p) or S' = a S + P S (p x q).
        if (l.tall)
            ctx.matmul({false, false, p, q, p, p, p, p, sg, sx, sx, batch, ap, ac, an},
                       1.0f,
                       poly,
                       cur,
                       static_cast<float>(a),
                       cur,
                       next);
        else
            ctx.matmul({false, true, q, p, p, q, p, q, sx, sg, sx, batch, ac, ap, an},
                       1.0f,
                       cur,
                       poly,
                       static_cast<float>(a),
                       cur,
                       next);
    }
    return buf[steps % 2];
}

}  // namespace muon

// x, out [E, A, B] bf16|f16|f32 (one dtype). Shapes are checked by the caller.
void newton_schulz(const Tensor& x, const Tensor& out, const MuonHyper& hyper) {
    constexpr std::string_view op = "newton_schulz";
    check_cuda_float(x, op, "x");
    check_dtype_as(out, x, op, "out", "x");
    if (x.numel() == 0) return;
    core::NvtxRange range("newton_schulz");
    const muon::Layout l = muon::layout_of(x);
    const auto blocks = static_cast<unsigned>(l.blocks());
    const Tensor partial = Tensor::scratch({l.blocks()}, DType::f64, Device::cuda);
    const Tensor inv = Tensor::scratch({l.e}, DType::f32, Device::cuda);
    const bool vec = vec_ok(l.n, {&x, &out});
    // The iterates alternate between two buffers; a bf16 out without padding between its matrices is one of them,
    // chosen so that the last iterate lands in it.
    const bool direct = out.dtype() == DType::bf16 && l.x_stride == l.n;
    const int steps = hyper.total_steps();
    const Tensor w0 = Tensor::scratch({l.e * l.x_stride}, DType::bf16, Device::cuda);
    const Tensor w1 = direct ? Tensor() : Tensor::scratch({l.e * l.x_stride}, DType::bf16, Device::cuda);
    bf16* out_b = direct ? static_cast<bf16*>(out.raw()) : nullptr;
    bf16* work0 = static_cast<bf16*>(w0.raw());
    bf16* buf0 = direct ? (steps % 2 == 0 ? out_b : work0) : work0;
    bf16* buf1 = direct ? (steps % 2 == 0 ? work0 : out_b) : static_cast<bf16*>(w1.raw());
    double* part = static_cast<double*>(partial.raw());
    float* inv_p = static_cast<float*>(inv.raw());
    const cudaStream_t stream = core::exec_stream();
    MT_CUDA_DISPATCH(x.dtype(), T, {
        const T* xp = static_cast<const T*>(x.raw());
        if (vec)
            sq_partial_kernel<8, T><<<blocks, kThreads, 0, stream>>>(xp, l.n, l.chunks, part);
        else
            sq_partial_kernel<1, T><<<blocks, kThreads, 0, stream>>>(xp, l.n, l.chunks, part);
        MT_CUDA_CHECK(cudaGetLastError());
        muon::launch_inv_norm(l, part, inv_p);
        if (vec)
            scale_kernel<8, T><<<blocks, kThreads, 0, stream>>>(xp, l.n, l.chunks, l.x_stride, inv_p, buf0);
        else
            scale_kernel<1, T><<<blocks, kThreads, 0, stream>>>(xp, l.n, l.chunks, l.x_stride, inv_p, buf0);
        MT_CUDA_CHECK(cudaGetLastError());
    });
    const bf16* last = muon::iterate(l, hyper, buf0, buf1);
    if (last == out_b) return;
    MT_CUDA_DISPATCH(out.dtype(), T, {
        T* o = static_cast<T*>(out.raw());
        if (vec)
            unpack_kernel<8, T><<<blocks, kThreads, 0, stream>>>(last, l.n, l.chunks, l.x_stride, o);
        else
            unpack_kernel<1, T><<<blocks, kThreads, 0, stream>>>(last, l.n, l.chunks, l.x_stride, o);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}

MT_REGISTER_KERNEL(newton_schulz, cuda, newton_schulz, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
