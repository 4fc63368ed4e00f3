// KDA context-parallel cost model on one device (issue 28, long_context.md §7 and §11): one row of T tokens cut into
// P = 2 cp spans of c = T / P tokens, each run the way a cp rank runs it (nn/layers/kda_cp.h), in one process.
//   relay:  the P spans one after another, each from the previous one's end state, then the backward in reverse with
//           the state gradients: cp.kda = "relay"'s critical path (every rank waits for the spans before its own).
//   affine: what one rank does for its 2 spans under cp.kda = "affine": the extended scan of each (V + K value
//           columns, the extra ones zero values from the identity: h and M; here as two scans of V and K columns), the
//           fold of all P (M, h) pairs on the host in f64 (as KdaCp does; the all-gather is not timed: one process),
//           the rerun of each span from its true start state; the backward mirrors it (each span's backward with a zero
//           end gradient, the reverse fold, the backward with the true end gradient).
// One JSON line per span length: the relay's serial fwd + bwd, the affine rank's fwd + bwd and its parts, one plain
// pass over the row, affine's cost per span over a plain span's (the "extra composition and rerun"), the relay's
// critical path over the affine rank's time, and the largest difference of affine's outputs from relay's.
//   bench_kda_cp [--t 65536] [--spans 2,4,8,16] [--h 16] [--k 128] [--v 128] [--iters 3] [--warmup 1] [--device cuda]
// --device cpu runs the same arithmetic on the CPU in f32 (a smoke run at small sizes; times are wall clock).
// The inputs are bench_kda's (the gate -5 sigmoid(2 x) decays fast), so a span's M is nearly zero and the outputs'
// difference mostly checks h; the cp model tests (tests/parallel/mpi/model_cp_test.cpp) are the proof of exactness.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/blas_kernels.h"
#include "core/tensor.h"
#include "gpu_timing.h"
#include "nn/segments.h"
#include "ops/kda.h"

namespace {

using mt::core::Device;
using mt::core::DType;
using mt::core::Tensor;
using mt::nn::time_rows;

struct Row {
    Tensor q, k, v, g, beta, dout;
};

// A [1, T, heads, dim] (or [1, T, heads]) input: kind 0 uniform [-2, 2), 1 rows L2-normalised to `scale`, 2 the
// lower-bounded gate -5 sigmoid(2 x), 3 beta in (0.05, 0.95). bf16 on the GPU, f32 on the CPU.
Tensor input(int64_t t, int64_t heads, int64_t dim, int kind, float scale, uint64_t seed, Device device) {
    const mt::core::Shape shape = dim == 1 ? mt::core::Shape{1, t, heads} : mt::core::Shape{1, t, heads, dim};
    std::vector<float> x(static_cast<size_t>(t * heads * dim));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& e : x) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        e = 4.0f * static_cast<float>(s >> 40) / static_cast<float>(1 << 24) - 2.0f;
    }
    if (kind == 1)
        for (size_t r = 0; r < x.size(); r += static_cast<size_t>(dim)) {
            float ss = 1e-6f;
            for (int64_t i = 0; i < dim; ++i) ss += x[r + i] * x[r + i];
            for (int64_t i = 0; i < dim; ++i) x[r + i] *= scale / std::sqrt(ss);
        }
    for (auto& e : x) e = kind == 2 ? -5.0f / (1.0f + std::exp(-2.0f * e)) : kind == 3 ? 0.5f + 0.225f * e : e;
    const Tensor host = Tensor::borrow(x.data(), shape, DType::f32);
    return device == Device::cpu ? host.clone() : host.to(DType::bf16).to_device(device);
}

// The spans of one row and the kernels' buffers for one span.
class Spans {
   public:
    Spans(const Row& row, int64_t spans, Device device) : row_(row), p_(spans), device_(device) {
        t_ = row.q.size(1), c_ = t_ / p_, hv_ = row.v.size(2), kd_ = row.q.size(3), vd_ = row.v.size(3);
        state_ = {1, hv_, kd_, vd_};
        out_ = Tensor::zeros(row.v.shape(), row.v.dtype(), device);
        for (const Tensor* x : {&row.q, &row.k, &row.v, &row.g, &row.beta})
            grads_.push_back(Tensor::zeros(x->shape(), x->dtype(), device));
    }
    int64_t span_len() const {
        return c_;
    }
    Tensor rows(const Tensor& x, int64_t s) const {
        return time_rows(x, s * c_, c_);
    }
    Tensor state() const {
        return Tensor::zeros(state_, DType::f32, device_);  // f32 states beside bf16 (GPU) or f32 (CPU) inputs
    }
    void forward(int64_t s, const Tensor& s0, const Tensor& st) const {
        mt::ops::kda_fwd(rows(row_.q, s),
                         rows(row_.k, s),
                         rows(row_.v, s),
                         rows(row_.g, s),
                         rows(row_.beta, s),
                         s0,
                         rows(out_, s),
                         st,
                         {});
    }
    // Returns the start state's gradient.
    Tensor backward(int64_t s, const Tensor& s0, const Tensor& dst) const {
        const Tensor ds0 = state();
        mt::ops::kda_bwd(rows(row_.q, s),
                         rows(row_.k, s),
                         rows(row_.v, s),
                         rows(row_.g, s),
                         rows(row_.beta, s),
                         s0,
                         rows(row_.dout, s),
                         dst,
                         rows(grads_[0], s),
                         rows(grads_[1], s),
                         rows(grads_[2], s),
                         rows(grads_[3], s),
                         rows(grads_[4], s),
                         ds0,
                         {});
        return ds0;
    }
    // The affine map of span s as one [1, HV, K, V + K] host tensor (h | M): h the state reached from zero, M = M I
    // the state reached from the identity with zero values. KdaCp runs both as one scan of V + K value columns; on
    // the device two scans (V, then K columns) do the same work without a strided copy into the wider values.
    Tensor affine_map(int64_t s) const {
        const Tensor h = state(), m = Tensor::zeros({1, hv_, kd_, kd_}, DType::f32, device_);
        Tensor eye = Tensor::zeros(m.shape(), DType::f32);
        for (int64_t hh = 0; hh < hv_; ++hh)
            for (int64_t j = 0; j < kd_; ++j) mt::core::tensor_set_flat(eye, (hh * kd_ + j) * kd_ + j, 1.0);
        eye = device_ == Device::cpu ? eye : eye.to_device(device_);
        const Tensor zeros_v = Tensor::zeros({1, c_, hv_, kd_}, row_.v.dtype(), device_);
        const Tensor o_v = Tensor::zeros({1, c_, hv_, vd_}, row_.v.dtype(), device_);
        const Tensor o_k = Tensor::zeros(zeros_v.shape(), zeros_v.dtype(), device_);
        mt::ops::kda_fwd(rows(row_.q, s),
                         rows(row_.k, s),
                         rows(row_.v, s),
                         rows(row_.g, s),
                         rows(row_.beta, s),
                         Tensor(),
                         o_v,
                         h,
                         {});
        mt::ops::kda_fwd(
            rows(row_.q, s), rows(row_.k, s), zeros_v, rows(row_.g, s), rows(row_.beta, s), eye, o_k, m, {});
        const Tensor hh = h.to_device(Device::cpu), mm = m.to_device(Device::cpu);
        const Tensor out = Tensor::zeros({1, hv_, kd_, vd_ + kd_}, DType::f32);
        for (int64_t r = 0; r < hv_ * kd_; ++r) {
            std::copy_n(hh.data<float>() + r * vd_, vd_, out.data<float>() + r * (vd_ + kd_));
            std::copy_n(mm.data<float>() + r * kd_, kd_, out.data<float>() + r * (vd_ + kd_) + vd_);
        }
        return out;
    }
    const Tensor& out() const {
        return out_;
    }
    int64_t heads() const {
        return hv_;
    }
    int64_t k() const {
        return kd_;
    }
    int64_t v() const {
        return vd_;
    }

   private:
    Row row_;
    int64_t p_, t_ = 0, c_ = 0, hv_ = 0, kd_ = 0, vd_ = 0;
    Device device_;
    mt::core::Shape state_;
    Tensor out_;
    std::vector<Tensor> grads_;
};

// The host fold over the P maps (f64, KdaCp's arithmetic: ops::kda_state_fold_fwd / _bwd): the start state of every
// span, S_in(0) = 0, S_in(g + 1) = M_g S_in(g) + h_g; and the reverse fold of the own start gradients e_g:
// dS_out(P - 1) = 0, dS_out(g - 1) = M_g^T dS_out(g) + e_g. maps: per span [HV, K, V + K]; returns per span [HV, K, V].
std::vector<std::vector<double>> fold(const std::vector<std::vector<double>>& maps,
                                      const std::vector<std::vector<double>>& own,
                                      int64_t hv,
                                      int64_t kd,
                                      int64_t vd,
                                      bool reverse) {
    const auto p = static_cast<int64_t>(maps.size());
    std::vector<std::vector<double>> at(static_cast<size_t>(p), std::vector<double>(static_cast<size_t>(hv * kd * vd)));
    std::vector<double> cur(static_cast<size_t>(hv * kd * vd), 0.0), next(cur.size());
    for (int64_t step = 0; step < p; ++step) {
        const int64_t g = reverse ? p - 1 - step : step;
        at[static_cast<size_t>(g)] = cur;
        const double* m = maps[static_cast<size_t>(g)].data();
        if (reverse)
            mt::ops::kda_state_fold_bwd(hv, kd, vd, m, own[static_cast<size_t>(g)].data(), cur.data(), next.data());
        else
            mt::ops::kda_state_fold_fwd(hv, kd, vd, m, cur.data(), next.data());
        cur.swap(next);
    }
    return at;
}

std::vector<double> host_f64(const Tensor& t) {
    const Tensor h = t.to_device(Device::cpu).to(DType::f64);
    return std::vector<double>(h.data<double>(), h.data<double>() + h.numel());
}

Tensor from_f64(const std::vector<double>& x, const Tensor& like) {
    const Tensor h = Tensor::borrow(const_cast<double*>(x.data()), like.shape(), DType::f64);
    return like.device() == Device::cpu ? h.to(like.dtype()) : h.to(like.dtype()).to_device(like.device());
}

void bench_spans(const Row& row, int64_t p, Device device, int warmup, int iters) {
    const Spans sp(row, p, device);
    // Relay: the serial chain, forward then backward; its start states are kept for the backward.
    std::vector<Tensor> s_in(static_cast<size_t>(p));
    auto relay = [&] {
        Tensor s = sp.state();
        for (int64_t g = 0; g < p; ++g) {
            s_in[static_cast<size_t>(g)] = s;
            const Tensor st = sp.state();
            sp.forward(g, s, st);
            s = st;
        }
        Tensor dst = Tensor();
        for (int64_t g = p - 1; g >= 0; --g) dst = sp.backward(g, s_in[static_cast<size_t>(g)], dst);
    };
    const double relay_ms = mt::bench::time_ms_on(device, relay, warmup, iters);
    const Tensor relay_out = sp.out().to_device(Device::cpu).to(DType::f64);
    // Affine, every span's maps once (the all-gathered input of the fold), and the own start gradients.
    std::vector<std::vector<double>> maps, own;
    for (int64_t g = 0; g < p; ++g) maps.push_back(host_f64(sp.affine_map(g)));
    const int64_t hv = sp.heads(), kd = sp.k(), vd = sp.v();
    const auto starts = fold(maps, {}, hv, kd, vd, false);
    for (int64_t g = 0; g < p; ++g)
        own.push_back(host_f64(sp.backward(g, from_f64(starts[static_cast<size_t>(g)], sp.state()), Tensor())));
    // One rank's work: spans r and P - 1 - r (r = 0), each phase timed apart and the whole.
    const int64_t mine[2] = {0, p - 1};
    double fold_ms = 0.0;
    auto timed_fold = [&](bool reverse) {
        const auto t0 = std::chrono::steady_clock::now();
        auto r = fold(maps, own, hv, kd, vd, reverse);
        fold_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        return r;
    };
    auto affine = [&] {
        for (int64_t g : mine) sp.affine_map(g);
        const auto in = timed_fold(false);
        for (int64_t g : mine) sp.forward(g, from_f64(in[static_cast<size_t>(g)], sp.state()), sp.state());
        for (int64_t g : mine) sp.backward(g, from_f64(in[static_cast<size_t>(g)], sp.state()), Tensor());
        const auto d_out = timed_fold(true);
        for (int64_t g : mine)
            sp.backward(g,
                        from_f64(in[static_cast<size_t>(g)], sp.state()),
                        from_f64(d_out[static_cast<size_t>(g)], sp.state()));
    };
    const double affine_ms = mt::bench::time_ms_on(device, affine, warmup, iters);
    fold_ms /= static_cast<double>(warmup + iters);
    // The plain cost of the rank's two spans: forward and backward from a given state.
    const double plain_ms = mt::bench::time_ms_on(
        device,
        [&] {
            for (int64_t g : mine) {
                const Tensor s0 = sp.state();
                sp.forward(g, s0, sp.state());
                sp.backward(g, s0, sp.state());
            }
        },
        warmup,
        iters);
    // Affine's outputs of every span (from the true starts) against relay's.
    for (int64_t g = 0; g < p; ++g) sp.forward(g, from_f64(starts[static_cast<size_t>(g)], sp.state()), sp.state());
    const Tensor aff_out = sp.out().to_device(Device::cpu).to(DType::f64);
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < aff_out.numel(); ++i) {
        diff = std::max(diff, std::abs(aff_out.data<double>()[i] - relay_out.data<double>()[i]));
        scale = std::max(scale, std::abs(relay_out.data<double>()[i]));
    }
    const int64_t t = row.q.size(1);
    const nlohmann::json line = {{"bench", "kda_cp"},
                                 {"device", device == Device::cpu ? "cpu" : "cuda"},
                                 {"T", t},
                                 {"cp", p / 2},
                                 {"spans", p},
                                 {"span_tokens", sp.span_len()},
                                 {"HV", hv},
                                 {"K", kd},
                                 {"V", vd},
                                 {"relay_fwd_bwd_ms", relay_ms},
                                 {"affine_rank_fwd_bwd_ms", affine_ms},
                                 {"affine_host_fold_ms", fold_ms},
                                 {"plain_two_spans_fwd_bwd_ms", plain_ms},
                                 {"affine_over_plain", plain_ms > 0.0 ? affine_ms / plain_ms : 0.0},
                                 {"relay_over_affine", affine_ms > 0.0 ? relay_ms / affine_ms : 0.0},
                                 {"max_rel_diff_affine_vs_relay", scale > 0.0 ? diff / scale : diff},
                                 {"iters", iters}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain KDA context-parallel cost model"};
    int64_t t = 65536, h = 16, kd = 128, vd = 128;
    std::vector<int64_t> spans = {2, 4, 8, 16};
    int iters = 3, warmup = 1;
    std::string device_name = "cuda";
    app.add_option("--t", t);
    app.add_option("--spans", spans, "P = 2 cp spans per row")->delimiter(',');
    app.add_option("--h", h);
    app.add_option("--k", kd);
    app.add_option("--v", vd);
    app.add_option("--iters", iters);
    app.add_option("--warmup", warmup);
    app.add_option("--device", device_name)->check(CLI::IsMember({"cpu", "cuda"}));
    CLI11_PARSE(app, argc, argv);
    const Device device = device_name == "cpu" ? Device::cpu : Device::cuda;
    if (!mt::core::backend_available(device)) {
        std::printf("%s\n", nlohmann::json{{"bench", "kda_cp"}, {"skipped", "no CUDA device"}}.dump().c_str());
        return 0;
    }
    const Row row{.q = input(t, h, kd, 1, 1.0f / std::sqrt(static_cast<float>(kd)), 1, device),
                  .k = input(t, h, kd, 1, 1.0f, 2, device),
                  .v = input(t, h, vd, 0, 1.0f, 3, device),
                  .g = input(t, h, kd, 2, 1.0f, 4, device),
                  .beta = input(t, h, 1, 3, 1.0f, 5, device),
                  .dout = input(t, h, vd, 0, 1.0f, 6, device)};
    for (int64_t p : spans) {
        if (p < 2 || p % 2 != 0 || t % (p * 64) != 0) {
            std::fprintf(stderr,
                         "bench_kda_cp: --spans %lld: need an even P >= 2 with T a multiple of 64 P\n",
                         static_cast<long long>(p));
            return 2;
        }
        bench_spans(row, p, device, warmup, iters);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_kda_cp: error: %s\n", e.what());
        return 1;
    }
}
