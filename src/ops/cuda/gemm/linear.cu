// CUDA linear through cuBLASLt: bf16 or f16 (or f32) operands, fp32 accumulation (CUBLAS_COMPUTE_32F, no TF32), the
// bias fused as an epilogue. Row-major [rows, cols] tensors are column-major [cols, rows] matrices to cuBLASLt, so
//   y  = x w^T   is  Y^T[M, N]  = W^T[K, M]^T . X^T[K, N]       (A = w, op T; B = x, op N)
//   dx = dy w    is  DX^T[K, N] = W^T[K, M] . DY^T[M, N]         (A = w, op N; B = dy, op N)
//   dw += dy^T x is  DW^T[K, M] = X^T[K, N] . (DY^T[M, N])^T     (A = x, op N; B = dy, op T; beta = 1)
// dw and dbias may be f32 (the mixed-precision trainer's grads) or the dtype of x. Descriptors and the chosen
// algorithm are cached per shape; one workspace comes from the caching allocator. cuBLASLt GEMMs are bitwise
// reproducible for a fixed algorithm, and dbias is a two-pass column sum in a fixed order: the op is deterministic.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <map>
#include <mutex>
#include <tuple>

#include "core/backend.h"
#include "core/cuda/cuda_check.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm/cublaslt_util.cuh"
#include "ops/linear.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

using core::Device;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

void lt_check(cublasStatus_t status, const char* what) {
    lt::check(status, what, "linear");
}
using lt::alignment_of;
using lt::cuda_type;

// One GEMM D = alpha op(A) op(B) + beta C (C = D) in column-major terms: m x n output, k the reduced dimension.
struct GemmShape {
    cudaDataType ab, cd;
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldd;
    bool bias;
    uint32_t align_a, align_b, align_d;
    auto key() const {
        return std::make_tuple(static_cast<int>(ab),
                               static_cast<int>(cd),
                               ta,
                               tb,
                               m,
                               n,
                               k,
                               lda,
                               ldb,
                               ldd,
                               bias,
                               align_a,
                               align_b,
                               align_d);
    }
};

struct GemmPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
};

class LtContext {
   public:
    static LtContext& get() {
        static LtContext* ctx = new LtContext();  // never destroyed: it may outlive the CUDA context at exit
        return *ctx;
    }

    // Runs one GEMM; bias (length m, dtype cd) is added by the epilogue when shape.bias is set.
    void matmul(const GemmShape& s, const void* a, const void* b, void* d, const void* bias, float beta) {
        std::lock_guard<std::mutex> lock(mutex_);
        GemmPlan& plan = plan_for(s);
        if (s.bias)
            lt_check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                     "set bias pointer");
        const float alpha = 1.0f;
        lt_check(cublasLtMatmul(handle_,
                                plan.desc,
                                &alpha,
                                a,
                                plan.a,
                                b,
                                plan.b,
                                &beta,
                                d,
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
    LtContext() {
        lt_check(cublasLtCreate(&handle_), "cublasLtCreate");
        for (void*& w : workspace_) w = core::backend_get(Device::cuda).alloc(kWorkspaceBytes);
    }

    GemmPlan& plan_for(const GemmShape& s) {
        auto it = plans_.find(s.key());
        if (it != plans_.end()) return it->second;
        GemmPlan p;
        lt_check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
        const cublasOperation_t ta = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
        lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
        if (s.bias) {
            const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
            lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
                     "epilogue");
            const cudaDataType bias_type = s.cd;
            lt_check(cublasLtMatmulDescSetAttribute(
                         p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
                     "bias type");
        }
        // Stored (not transposed) shapes: A is m x k (k x m when transposed), B is k x n (n x k).
        lt_check(cublasLtMatrixLayoutCreate(&p.a, s.ab, s.ta ? s.k : s.m, s.ta ? s.m : s.k, s.lda), "layout a");
        lt_check(cublasLtMatrixLayoutCreate(&p.b, s.ab, s.tb ? s.n : s.k, s.tb ? s.k : s.n, s.ldb), "layout b");
        lt_check(cublasLtMatrixLayoutCreate(&p.d, s.cd, s.m, s.n, s.ldd), "layout d");

        cublasLtMatmulPreference_t pref = nullptr;
        lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
        const uint64_t ws = kWorkspaceBytes;
        lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                 "workspace preference");
        const uint32_t aligns[] = {s.align_a, s.align_b, s.align_d, s.align_d};
        const cublasLtMatmulPreferenceAttributes_t align_attrs[] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; ++i)
            lt_check(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &aligns[i], sizeof(uint32_t)),
                     "alignment preference");
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        const cublasStatus_t st =
            cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
        cublasLtMatmulPreferenceDestroy(pref);
        if (st != CUBLAS_STATUS_SUCCESS || found == 0)
            core::fail(core::ExitCode::device,
                       "cuBLASLt has no algorithm for a {}x{}x{} GEMM (status {})",
                       s.m,
                       s.n,
                       s.k,
                       static_cast<int>(st));
        p.algo = result.algo;
        return plans_.emplace(s.key(), p).first->second;
    }

    std::mutex mutex_;
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_[2] = {};  // one per lane (core/exec.h): GEMMs of the two lanes may run at the same time
    std::map<decltype(GemmShape{}.key()), GemmPlan> plans_;
};

// y[n, m] = bias[m] (the K = 0 forward, where there is no GEMM).
template <typename T>
__global__ void broadcast_rows_kernel(const T* bias, T* y, int64_t n, int64_t m) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n * m) y[i] = bias[i % m];
}

constexpr int kColTile = 32, kRowLanes = 8, kRowsPerChunk = 1024;

// Pass 1 of dbias: partial[c, m] = sum of dy[n, m] over the rows n of chunk c, in a fixed order.
template <typename T>
__global__ void column_partial_kernel(const T* dy, float* partial, int64_t n, int64_t m) {
    __shared__ float sums[kRowLanes][kColTile];
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
    const int64_t r1 = r0 + kRowsPerChunk < n ? r0 + kRowsPerChunk : n;
    float acc = 0.0f;
    if (col < m)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) acc += to_f32(dy[r * m + col]);
    sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < m) {
        float s = 0.0f;
        for (int i = 0; i < kRowLanes; ++i) s += sums[i][threadIdx.x];
        partial[blockIdx.y * m + col] = s;
    }
}

// Pass 2: dbias[m] += sum over chunks of partial[c, m], chunks in order.
template <typename G>
__global__ void column_finish_kernel(const float* partial, G* dbias, int64_t chunks, int64_t m) {
    const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (col >= m) return;
    float s = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) s += partial[c * m + col];
    dbias[col] = from_f32<G>(to_f32(dbias[col]) + s);
}

unsigned blocks_for(int64_t n, int threads) {
    return static_cast<unsigned>((n + threads - 1) / threads);
}

template <typename T>
void launch_dbias(const Tensor& dy, const Tensor& dbias, int64_t n, int64_t m) {
    const int64_t chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
    core::Backend& be = core::backend_get(Device::cuda);
    const size_t bytes = static_cast<size_t>(chunks * m) * sizeof(float);
    auto* partial = static_cast<float*>(be.alloc_scratch(bytes));  // every column of every chunk is written
    const dim3 grid(blocks_for(m, kColTile), static_cast<unsigned>(chunks));
    column_partial_kernel<T>
        <<<grid, dim3(kColTile, kRowLanes), 0, core::exec_stream()>>>(static_cast<const T*>(dy.raw()), partial, n, m);
    MT_CUDA_CHECK(cudaGetLastError());
    if (dbias.dtype() == DType::f32)
        column_finish_kernel<float>
            <<<blocks_for(m, 256), 256, 0, core::exec_stream()>>>(partial, static_cast<float*>(dbias.raw()), chunks, m);
    else
        column_finish_kernel<T>
            <<<blocks_for(m, 256), 256, 0, core::exec_stream()>>>(partial, static_cast<T*>(dbias.raw()), chunks, m);
    MT_CUDA_CHECK(cudaGetLastError());
    be.free(partial, bytes);  // stream order keeps the reuse safe
}

void check_dtypes(const Tensor& x, std::string_view op) {
    check_cuda_float(x, op, "x");
}

void check_grad_dtype(const Tensor& g, const Tensor& x, std::string_view op, std::string_view name) {
    MT_CHECK(g.dtype() == x.dtype() || g.dtype() == DType::f32,
             "{}: {} has dtype {}, expected f32 or {} (the dtype of x)",
             op,
             name,
             core::dtype_name(g.dtype()),
             core::dtype_name(x.dtype()));
}

}  // namespace

// x [N, K], w [M, K], bias [M] or undefined, y [N, M]; all bf16, all f16 or all f32. Shapes are checked by the caller.
void linear_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
    constexpr std::string_view op = "linear_fwd";
    check_dtypes(x, op);
    for (const Tensor* t : {&w, &bias, &y})
        if (t->defined())
            MT_CHECK(t->dtype() == x.dtype(),
                     "{}: a tensor of shape {} has dtype {}, expected {} (the dtype of x)",
                     op,
                     core::shape_str(t->shape()),
                     core::dtype_name(t->dtype()),
                     core::dtype_name(x.dtype()));
    const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
    if (n == 0 || m == 0) return;
    core::NvtxRange range("linear_fwd");
    if (k == 0) {
        if (!bias.defined()) return y.zero();
        MT_CUDA_DISPATCH(x.dtype(), T, {
            broadcast_rows_kernel<<<blocks_for(n * m, 256), 256, 0, core::exec_stream()>>>(
                static_cast<const T*>(bias.raw()), static_cast<T*>(y.raw()), n, m);
        });
        MT_CUDA_CHECK(cudaGetLastError());
        return;
    }
    const cudaDataType t = cuda_type(x.dtype());
    const GemmShape s{t,
                      t,
                      true,
                      false,
                      m,
                      n,
                      k,
                      k,
                      k,
                      m,
                      bias.defined(),
                      alignment_of(w.raw()),
                      alignment_of(x.raw()),
                      alignment_of(y.raw())};
    LtContext::get().matmul(s, w.raw(), x.raw(), y.raw(), bias.defined() ? bias.raw() : nullptr, 0.0f);
}
MT_REGISTER_KERNEL(linear_fwd, cuda, linear_fwd, ::mt::ops::half_and_float_dtypes);

// x [N, K], w [M, K], dy [N, M]; dx [N, K] written or accumulated (skipped when undefined); dw [M, K] accumulated
// (beta = 1) or written (beta = 0: no read of dw); dbias [M] accumulates.
void linear_bwd(const Tensor& x,
                const Tensor& w,
                const Tensor& dy,
                const Tensor& dx,
                const Tensor& dw,
                const Tensor& dbias,
                bool accumulate_dx,
                bool accumulate_dw) {
    constexpr std::string_view op = "linear_bwd";
    check_dtypes(x, op);
    MT_CHECK(w.dtype() == x.dtype() && dy.dtype() == x.dtype() && (!dx.defined() || dx.dtype() == x.dtype()),
             "{}: w, dy and dx must have the dtype of x ({})",
             op,
             core::dtype_name(x.dtype()));
    check_grad_dtype(dw, x, op, "dw");
    if (dbias.defined()) check_grad_dtype(dbias, x, op, "dbias");
    const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
    core::NvtxRange range("linear_bwd");
    const cudaDataType t = cuda_type(x.dtype());
    if (dx.defined() && n > 0 && k > 0) {
        if (m == 0) {
            if (!accumulate_dx) dx.zero();
        } else {
            const GemmShape s{t,
                              t,
                              false,
                              false,
                              k,
                              n,
                              m,
                              k,
                              m,
                              k,
                              false,
                              alignment_of(w.raw()),
                              alignment_of(dy.raw()),
                              alignment_of(dx.raw())};
            // beta = 1 adds to dx in the epilogue, in f32 before the one rounding to dx's dtype.
            LtContext::get().matmul(s, w.raw(), dy.raw(), dx.raw(), nullptr, accumulate_dx ? 1.0f : 0.0f);
        }
    }
    if (n == 0 || m == 0) {
        if (n == 0 && !accumulate_dw) dw.zero();  // the gradient of no rows, written
        return;
    }
    if (k > 0) {
        const GemmShape s{t,
                          cuda_type(dw.dtype()),
                          false,
                          true,
                          k,
                          m,
                          n,
                          k,
                          m,
                          k,
                          false,
                          alignment_of(x.raw()),
                          alignment_of(dy.raw()),
                          alignment_of(dw.raw())};
        LtContext::get().matmul(s, x.raw(), dy.raw(), dw.raw(), nullptr, accumulate_dw ? 1.0f : 0.0f);
    }
    if (dbias.defined()) {
        MT_CUDA_DISPATCH(x.dtype(), T, launch_dbias<T>(dy, dbias, n, m));
    }
}
MT_REGISTER_KERNEL(linear_bwd, cuda, linear_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
