// CUDA grouped linear (the MoE expert GEMMs). With offsets on the device (the entry point's choice,
// ops/grouped_linear.h) the one-launch kernels of grouped_gemm_sm90.cu run; with host offsets, the cuBLASLt path
// here: one GEMM per non-empty expert, spread round-robin over a few side streams forked from the ops' stream and
// joined back, so that the small GEMMs of many experts overlap. The per-expert shapes come from a host copy of the
// plan's offsets (the MoE layer copies them back once per forward and reuses them in the backward). x, w, y, dy, dx
// bf16|f16|f32 (one dtype); dw that dtype or f32 (the mixed-precision gradients), accumulated with beta = 1. fp32
// accumulation (CUBLAS_COMPUTE_32F, no TF32). Row-major tensors are column-major to cuBLASLt, as in linear.cu:
//   y_e  = x_e w_e^T   : Y^T[M, r]  = (W_e^T[K, M])^T X^T[K, r]
//   dx_e = dy_e w_e    : DX^T[K, r] = W_e^T[K, M] DY^T[M, r]
//   dw_e += dy_e^T x_e : DW^T[K, M] = X^T[K, r] (DY^T[M, r])^T
// The algorithm is chosen once per (shape with the row count rounded up to 128): row counts change every step, and
// a heuristic query per GEMM would cost more host time than the GEMM. With many experts the GEMMs are short enough
// that enqueueing them bounds the op (about 7 us of host time per cublasLtMatmul), so each side stream has its own
// host thread and cuBLASLt handle that enqueue its share in parallel; algorithms and layouts are resolved first, on
// the calling thread. Each side stream has its own workspace, every
// GEMM writes its own expert's rows or weights, and a fixed algorithm per shape gives the same bits on every run: the
// op is deterministic.
#include <cublasLt.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "core/backend.h"
#include "core/cuda/cuda_check.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm/cublaslt_util.cuh"
#include "ops/cuda/gemm/grouped_gemm_sm90.h"
#include "ops/grouped_linear.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

using core::Device;

constexpr int kStreams = 4;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int64_t kRowBucket = 128;
constexpr size_t kMaxLayouts = 16384;

// Persistent host threads 1..n-1 that run job(i) together with the caller (i = 0); run() returns when all are done
// and rethrows the first error of a worker.
class HostWorkers {
   public:
    explicit HostWorkers(int n) {
        for (int i = 1; i < n; ++i) std::thread([this, i] { loop(i); }).detach();  // live as long as the process
    }
    void run(int used, const std::function<void(int)>& job) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            job_ = &job;
            used_ = used;
            pending_ = used - 1;
            error_.clear();
            ++generation_;
        }
        wake_.notify_all();
        std::string mine;
        try {
            job(0);
        } catch (const std::exception& e) {
            mine = e.what();
        }
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [&] { return pending_ == 0; });
        if (!mine.empty() || !error_.empty())
            core::fail(core::ExitCode::device, "grouped_linear: {}", mine.empty() ? error_ : mine);
    }

   private:
    void loop(int i) {
        uint64_t seen = 0;
        for (;;) {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return generation_ != seen; });
            seen = generation_;
            if (i >= used_) continue;
            const std::function<void(int)>* job = job_;
            lock.unlock();
            std::string err;
            try {
                (*job)(i);
            } catch (const std::exception& e) {
                err = e.what();
            }
            lock.lock();
            if (!err.empty() && error_.empty()) error_ = err;
            if (--pending_ == 0) done_.notify_one();
        }
    }

    std::mutex mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(int)>* job_ = nullptr;
    int used_ = 0, pending_ = 0;
    uint64_t generation_ = 0;
    std::string error_;
};

void lt_check(cublasStatus_t status, const char* what) {
    lt::check(status, what, "grouped_linear");
}
using lt::alignment_of;
using lt::cuda_type;

// D[m, n] = op(A) op(B) + beta D, column-major; m, n, k as cuBLASLt names them.
struct Gemm {
    cudaDataType ab, cd;
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldd;
    uint32_t align_a, align_b, align_d;
    // Shapes that share an algorithm: the row-dependent dimension rounded up (rows is n for y and dx, k for dw).
    auto algo_key(bool rows_in_k) const {
        const int64_t nb = rows_in_k ? n : (n + kRowBucket - 1) / kRowBucket * kRowBucket;
        const int64_t kb = rows_in_k ? (k + kRowBucket - 1) / kRowBucket * kRowBucket : k;
        return std::make_tuple(
            static_cast<int>(ab), static_cast<int>(cd), ta, tb, m, nb, kb, lda, ldb, ldd, align_a, align_b, align_d);
    }
};

class GroupedContext {
   public:
    static GroupedContext& get() {
        static GroupedContext* ctx = new GroupedContext();  // never destroyed: it may outlive the CUDA context
        return *ctx;
    }

    // Runs the GEMMs (pointers per GEMM) on the side streams, after the work queued so far on the ops' stream; the
    // ops' stream then waits for all of them.
    void run(const std::vector<Gemm>& gemms,
             const std::vector<std::tuple<const void*, const void*, void*>>& ptrs,
             float beta,
             bool rows_in_k) {
        if (gemms.empty()) return;
        std::lock_guard<std::mutex> lock(mutex_);
        const cudaStream_t main = core::exec_stream();
        const int used = static_cast<int>(std::min<size_t>(kStreams, gemms.size()));
        if (layouts_.size() + gemms.size() > kMaxLayouts) layouts_.clear();  // bounded; nothing prepared yet
        std::vector<std::pair<const cublasLtMatmulAlgo_t*, const Layouts*>> prepared;
        prepared.reserve(gemms.size());
        for (const Gemm& g : gemms) prepared.emplace_back(&algo_for(g, rows_in_k), &layouts_for(g));
        MT_CUDA_CHECK(cudaEventRecord(fork_, main));
        for (int s = 0; s < used; ++s) MT_CUDA_CHECK(cudaStreamWaitEvent(streams_[s], fork_, 0));
        // The current GPU is per host thread: the workers take the caller's (a multi-GPU job's rank drives its local
        // GPU, not GPU 0), which owns the handles, streams and workspaces.
        int device = 0;
        MT_CUDA_CHECK(cudaGetDevice(&device));
        workers_->run(used, [&](int s) {
            if (s != 0) MT_CUDA_CHECK(cudaSetDevice(device));
            for (size_t g = static_cast<size_t>(s); g < gemms.size(); g += kStreams)
                matmul(gemms[g], *prepared[g].first, *prepared[g].second, ptrs[g], beta, s);
        });
        for (int s = 0; s < used; ++s) {
            MT_CUDA_CHECK(cudaEventRecord(join_[s], streams_[s]));
            MT_CUDA_CHECK(cudaStreamWaitEvent(main, join_[s], 0));
        }
    }

   private:
    GroupedContext() : workers_(std::make_unique<HostWorkers>(kStreams)) {
        for (cublasLtHandle_t& h : handles_) lt_check(cublasLtCreate(&h), "cublasLtCreate");
        for (int ta = 0; ta < 2; ++ta)
            for (int tb = 0; tb < 2; ++tb) {
                cublasLtMatmulDesc_t& d = desc_[ta][tb];
                lt_check(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
                const cublasOperation_t a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
                lt_check(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &a, sizeof(a)), "transa");
                lt_check(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &b, sizeof(b)), "transb");
            }
        for (int s = 0; s < kStreams; ++s) {
            MT_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[s], cudaStreamNonBlocking));
            MT_CUDA_CHECK(cudaEventCreateWithFlags(&join_[s], cudaEventDisableTiming));
            workspace_[s] = core::backend_get(Device::cuda).alloc(kWorkspaceBytes);
        }
        MT_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    }

    struct Layouts {
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
        ~Layouts() {
            if (a) cublasLtMatrixLayoutDestroy(a);
            if (b) cublasLtMatrixLayoutDestroy(b);
            if (d) cublasLtMatrixLayoutDestroy(d);
        }
    };

    static void make_layouts(const Gemm& g, Layouts* l) {
        lt_check(cublasLtMatrixLayoutCreate(&l->a, g.ab, g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.lda), "layout a");
        lt_check(cublasLtMatrixLayoutCreate(&l->b, g.ab, g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.ldb), "layout b");
        lt_check(cublasLtMatrixLayoutCreate(&l->d, g.cd, g.m, g.n, g.ldd), "layout d");
    }

    // The algorithm for the bucket of g: the heuristic's first answer for the bucket's largest shape.
    const cublasLtMatmulAlgo_t& algo_for(const Gemm& g, bool rows_in_k) {
        const auto key = g.algo_key(rows_in_k);
        auto it = algos_.find(key);
        if (it != algos_.end()) return it->second;
        Gemm big = g;
        if (rows_in_k)
            big.k = std::get<6>(key);
        else
            big.n = std::get<5>(key);
        Layouts l;
        make_layouts(big, &l);
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
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
            handles_[0], desc_[g.ta][g.tb], l.a, l.b, l.d, l.d, pref, 1, &result, &found);
        cublasLtMatmulPreferenceDestroy(pref);
        if (st != CUBLAS_STATUS_SUCCESS || found == 0)
            core::fail(core::ExitCode::device,
                       "cuBLASLt has no algorithm for a {}x{}x{} grouped GEMM (status {})",
                       big.m,
                       big.n,
                       big.k,
                       static_cast<int>(st));
        return algos_.emplace(key, result.algo).first->second;
    }

    // The layouts of g's exact shape, cached (bounded by run()).
    const Layouts& layouts_for(const Gemm& g) {
        const auto key = std::make_tuple(static_cast<int>(g.ab), static_cast<int>(g.cd), g.ta, g.tb, g.m, g.n, g.k);
        auto it = layouts_.find(key);
        if (it != layouts_.end()) return *it->second;
        auto l = std::make_unique<Layouts>();
        make_layouts(g, l.get());
        return *layouts_.emplace(key, std::move(l)).first->second;
    }

    // One GEMM on side stream `stream`, enqueued by that stream's host thread with its own handle.
    void matmul(const Gemm& g,
                const cublasLtMatmulAlgo_t& algo,
                const Layouts& l,
                const std::tuple<const void*, const void*, void*>& p,
                float beta,
                int stream) {
        const float alpha = 1.0f;
        const auto [a, b, d] = p;
        lt_check(cublasLtMatmul(handles_[stream],
                                desc_[g.ta][g.tb],
                                &alpha,
                                a,
                                l.a,
                                b,
                                l.b,
                                &beta,
                                d,
                                l.d,
                                d,
                                l.d,
                                &algo,
                                workspace_[stream],
                                kWorkspaceBytes,
                                streams_[stream]),
                 "cublasLtMatmul");
    }

    std::mutex mutex_;
    std::unique_ptr<HostWorkers> workers_;
    cublasLtHandle_t handles_[kStreams] = {};
    cublasLtMatmulDesc_t desc_[2][2] = {};
    cudaStream_t streams_[kStreams] = {};
    cudaEvent_t join_[kStreams] = {}, fork_ = nullptr;
    void* workspace_[kStreams] = {};
    std::map<decltype(Gemm{}.algo_key(false)), cublasLtMatmulAlgo_t> algos_;
    std::map<std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t>, std::unique_ptr<Layouts>> layouts_;
};

}  // namespace

// x [R, K], w [E, M, K], y [R, M]; offsets [E + 1] i32 on the device (the device kernel) or the host (cuBLASLt).
// Shapes are checked by the caller, which also chose the implementation (impl is not read here).
void grouped_linear_fwd(const Tensor& x, const Tensor& w, const Tensor& offsets_in, const Tensor& y, GroupedGemm) {
    constexpr std::string_view op = "grouped_linear_fwd";
    check_cuda_float(x, op, "x");
    check_dtype_as(w, x, op, "w", "x");
    check_dtype_as(y, x, op, "y", "x");
    if (offsets_in.device() == Device::cuda) return grouped_gemm_sm90_fwd(x, w, offsets_in, y);
    const int32_t* offsets = offsets_in.data<int32_t>();
    const int64_t e = w.size(0), m = w.size(1), k = w.size(2);
    if (m == 0) return;
    core::NvtxRange range("grouped_linear_fwd");
    const size_t es = core::dtype_size(x.dtype());
    const cudaDataType t = cuda_type(x.dtype());
    std::vector<Gemm> gemms;
    std::vector<std::tuple<const void*, const void*, void*>> ptrs;
    for (int64_t j = 0; j < e; ++j) {
        const int64_t r0 = offsets[j], rows = offsets[j + 1] - r0;
        if (rows == 0) continue;
        const char* wj = static_cast<const char*>(w.raw()) + j * m * k * es;
        const char* xj = static_cast<const char*>(x.raw()) + r0 * k * es;
        char* yj = static_cast<char*>(y.raw()) + r0 * m * es;
        if (k == 0) {
            MT_CUDA_CHECK(cudaMemsetAsync(yj, 0, rows * m * es, core::exec_stream()));
            continue;
        }
        gemms.push_back({t, t, true, false, m, rows, k, k, k, m, alignment_of(wj), alignment_of(xj), alignment_of(yj)});
        ptrs.emplace_back(wj, xj, yj);
    }
    GroupedContext::get().run(gemms, ptrs, 0.0f, false);
}
MT_REGISTER_KERNEL(grouped_linear_fwd, cuda, grouped_linear_fwd, ::mt::ops::half_and_float_dtypes);

// dy [R, M]; dx [R, K] written (=) or accumulated (accumulate_dx), skipped when undefined; dw [E, M, K] accumulated,
// or written without accumulate_dw (beta = 0; an empty expert's zeroed).
void grouped_linear_bwd(const Tensor& x,
                        const Tensor& w,
                        const Tensor& offsets_in,
                        const Tensor& dy,
                        const Tensor& dx,
                        const Tensor& dw,
                        bool accumulate_dx,
                        GroupedGemm,
                        bool accumulate_dw) {
    constexpr std::string_view op = "grouped_linear_bwd";
    check_cuda_float(x, op, "x");
    check_dtype_as(w, x, op, "w", "x");
    check_dtype_as(dy, x, op, "dy", "x");
    if (dx.defined()) check_dtype_as(dx, x, op, "dx", "x");
    MT_CHECK(!dw.defined() || dw.dtype() == x.dtype() || dw.dtype() == DType::f32,
             "{}: dw has dtype {}, expected f32 or {} (the dtype of x)",
             op,
             core::dtype_name(dw.dtype()),
             core::dtype_name(x.dtype()));
    if (offsets_in.device() == Device::cuda)
        return grouped_gemm_sm90_bwd(x, w, offsets_in, dy, dx, dw, accumulate_dx, accumulate_dw);
    const int32_t* offsets = offsets_in.data<int32_t>();
    const int64_t e = w.size(0), m = w.size(1), k = w.size(2);
    if (k == 0) return;
    core::NvtxRange range("grouped_linear_bwd");
    const size_t es = core::dtype_size(x.dtype()), gs = dw.defined() ? core::dtype_size(dw.dtype()) : 0;
    const cudaDataType t = cuda_type(x.dtype());
    std::vector<Gemm> gx, gw;
    std::vector<std::tuple<const void*, const void*, void*>> px, pw;
    for (int64_t j = 0; j < e; ++j) {
        const int64_t r0 = offsets[j], rows = offsets[j + 1] - r0;
        if (rows == 0) {
            if (dw.defined() && !accumulate_dw)  // written: an expert without rows has a zero gradient
                MT_CUDA_CHECK(
                    cudaMemsetAsync(static_cast<char*>(dw.raw()) + j * m * k * gs, 0, m * k * gs, core::exec_stream()));
            continue;
        }
        const char* wj = static_cast<const char*>(w.raw()) + j * m * k * es;
        const char* xj = static_cast<const char*>(x.raw()) + r0 * k * es;
        const char* dyj = static_cast<const char*>(dy.raw()) + r0 * m * es;
        if (dx.defined()) {
            char* dxj = static_cast<char*>(dx.raw()) + r0 * k * es;
            if (m == 0) {
                if (!accumulate_dx) MT_CUDA_CHECK(cudaMemsetAsync(dxj, 0, rows * k * es, core::exec_stream()));
            } else {
                gx.push_back(
                    {t, t, false, false, k, rows, m, k, m, k, alignment_of(wj), alignment_of(dyj), alignment_of(dxj)});
                px.emplace_back(wj, dyj, dxj);
            }
        }
        if (m == 0 || !dw.defined()) continue;
        char* dwj = static_cast<char*>(dw.raw()) + j * m * k * gs;
        gw.push_back({t,
                      cuda_type(dw.dtype()),
                      false,
                      true,
                      k,
                      m,
                      rows,
                      k,
                      m,
                      k,
                      alignment_of(xj),
                      alignment_of(dyj),
                      alignment_of(dwj)});
        pw.emplace_back(xj, dyj, dwj);
    }
    GroupedContext::get().run(gx, px, accumulate_dx ? 1.0f : 0.0f, false);
    GroupedContext::get().run(gw, pw, accumulate_dw ? 1.0f : 0.0f, true);
}
MT_REGISTER_KERNEL(grouped_linear_bwd, cuda, grouped_linear_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
