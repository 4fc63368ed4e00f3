// The op-test harness: the case registry, seeded inputs and the error helpers (see op_harness.h); the modes are in
// op_modes.cpp.
#include "op_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/backend.h"
#include "core/rng.h"

namespace mt::ops::test {

namespace {

std::set<std::string>& registered_ops() {
    static std::set<std::string> ops;
    return ops;
}

class FnTest : public testing::Test {
   public:
    explicit FnTest(std::function<void()> body) : body_(std::move(body)) {}
    void TestBody() override {
        body_();
    }

   private:
    std::function<void()> body_;
};

void register_test(const char* suite, const std::string& name, std::function<void()> body) {
    testing::RegisterTest(suite, name.c_str(), nullptr, nullptr, __FILE__, __LINE__, [body]() -> testing::Test* {
        return new FnTest(body);
    });
}

}  // namespace

void op_register(OpCase c) {
    registered_ops().insert(c.op);
    if (!c.parity_only) {
        register_test("OpGrad", c.name, [c] { op_check_grad(c); });
        register_test("OpF32", c.name, [c] { op_check_f32(c); });
        register_test("OpThreads", c.name, [c] { op_check_threads(c); });
    }
    // A case with every device dtype off would pass while checking nothing: it gets no parity test, and a
    // parity_only one (which has no other test) is a registration mistake that fails.
    if (!c.parity.bf16 && !c.parity.f32) {
        if (c.parity_only)
            register_test("OpParity", c.name, [name = c.name] {
                ADD_FAILURE() << name << ": a parity_only case with every device dtype off checks nothing";
            });
        return;
    }
    register_test("OpParity", c.name, [c] {
        if (!op_gpu_available()) GTEST_SKIP() << kOpNoGpuMessage;
        op_check_parity(c);
    });
}

void op_register_parity_check(const std::string& op, const std::string& name, std::function<void()> body) {
    registered_ops().insert(op);
    register_test("OpParity", name, [body] {
        if (!op_gpu_available()) GTEST_SKIP() << kOpNoGpuMessage;
        const int64_t before = op_parity_comparisons();
        try {
            body();
        } catch (const core::Error& e) {
            ADD_FAILURE() << "the CUDA side failed: " << e.what();
        }
        EXPECT_GT(op_parity_comparisons(), before) << "the parity check compared no tensor and checked no error";
    });
}

bool op_gpu_available() {
    return core::backend_available(core::Device::cuda);
}

void op_register_check(const std::string& op, const std::string& name, std::function<void()> body) {
    registered_ops().insert(op);
    register_test("OpCheck", name, std::move(body));
}

std::set<std::string> op_registered_ops() {
    return registered_ops();
}

namespace {

// Host copy (contiguous) of a tensor on any device.
Tensor on_host(const Tensor& t) {
    return t.device() == core::Device::cpu ? t : t.to_device(core::Device::cpu);
}

// sum (a - b)^2, sum b^2 and max |a - b| over all elements (NaN in max_diff where any difference is NaN).
struct DiffSums {
    long double diff = 0, ref = 0, max_diff = 0;
};

DiffSums diff_sums(const Tensor& a_any, const Tensor& b_any) {
    EXPECT_EQ(a_any.shape(), b_any.shape());
    const Tensor a = on_host(a_any), b = on_host(b_any);
    DiffSums s;
    for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
        const long double x = core::tensor_get_flat(a, i), y = core::tensor_get_flat(b, i);
        const long double d = std::fabs(x - y);
        s.diff += d * d;
        s.ref += y * y;
        if (!(d <= s.max_diff)) s.max_diff = d;  // keeps a NaN
    }
    return s;
}

int64_t& comparisons() {
    static int64_t n = 0;
    return n;
}

}  // namespace

double op_rho(const Tensor& a, const Tensor& b) {
    const DiffSums s = diff_sums(a, b);
    if (s.ref == 0) return s.diff == 0 ? 0.0 : std::numeric_limits<double>::infinity();
    return static_cast<double>(std::sqrt(s.diff / s.ref));
}

ParityError op_parity_error(const Tensor& got, const Tensor& ref_tensor, double rms_floor) {
    const DiffSums s = diff_sums(got, ref_tensor);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (std::isnan(static_cast<double>(s.diff)) || std::isnan(static_cast<double>(s.max_diff))) return {nan, nan};
    if (s.diff == 0) return {0.0, 0.0};
    const long double n = static_cast<long double>(std::max<int64_t>(ref_tensor.numel(), 1));
    const long double floor = static_cast<long double>(rms_floor) * rms_floor * n;  // rms^2 n
    const long double scale = std::max(s.ref, floor);                               // |b|^2 (or the floor's)
    return {static_cast<double>(std::sqrt(s.diff / scale)), static_cast<double>(s.max_diff / std::sqrt(scale / n))};
}

double op_parity_rho(const Tensor& got, const Tensor& ref_tensor, double rms_floor) {
    return op_parity_error(got, ref_tensor, rms_floor).rho;
}

void op_expect_parity(const std::string& name,
                      const std::string& what,
                      const Tensor& got,
                      const Tensor& ref,
                      double budget,
                      double rms_floor,
                      double max_abs_factor) {
    const ParityError e = op_parity_error(got, ref, rms_floor);
    ++comparisons();
    fmt::print("[ PARITY ] {} {}: rho {:.3e} (budget {:.0e}), max-abs {:.3e} (budget {:.0e})\n",
               name,
               what,
               e.rho,
               budget,
               e.max_abs,
               max_abs_factor * budget);
    EXPECT_LE(e.rho, budget) << name << " " << what << ": CUDA against the CPU reference (rho)";
    EXPECT_LE(e.max_abs, max_abs_factor * budget)
        << name << " " << what << ": CUDA against the CPU reference (largest element error / reference rms)";
}

bool op_same_bytes(const Tensor& a_any, const Tensor& b_any) {
    const Tensor a = on_host(a_any), b = on_host(b_any);
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

int64_t op_parity_comparisons() {
    return comparisons();
}

Tensor op_randn(const Shape& shape, uint64_t seed, uint64_t stream, double mean, double std) {
    Tensor t = Tensor::zeros(shape, DType::f64);
    core::rng_fill_normal(t, seed, stream, mean, std);
    return t;
}

Tensor op_uniform(const Shape& shape, uint64_t seed, uint64_t stream, double lo, double hi) {
    Tensor t = Tensor::zeros(shape, DType::f64);
    core::rng_fill_uniform(t, seed, stream, lo, hi);
    return t;
}

Tensor op_rand_ids(const Shape& shape, uint64_t seed, uint64_t stream, int32_t lo, int32_t hi) {
    Tensor t = Tensor::zeros(shape, DType::i32);
    int32_t* p = t.data<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i)
        p[i] = lo + static_cast<int32_t>(core::rng_u64(seed, stream, i) % static_cast<uint64_t>(hi - lo));
    return t;
}

uint64_t op_seed(const std::string& name) {
    return core::hash_name(name.c_str());
}

Tensor op_like(const Tensor& t) {
    return Tensor::zeros(t.shape(), t.dtype(), t.device());
}

Tensor op_like(const Tensor& t, const Shape& shape) {
    return Tensor::zeros(shape, t.dtype(), t.device());
}

Tensor op_stat_like(const Tensor& t, const Shape& shape) {
    const bool half = t.dtype() == DType::bf16 || t.dtype() == DType::f16;
    return Tensor::zeros(shape, half ? DType::f32 : t.dtype(), t.device());
}

Tensor op_noncontiguous(const Shape& shape, DType dtype) {
    Shape wide = shape;
    wide.push_back(2);
    Tensor t = Tensor::zeros(wide, dtype).select(static_cast<int>(shape.size()), 0);
    EXPECT_FALSE(t.is_contiguous()) << core::shape_str(shape);
    return t;
}

Tensor op_cuda_view(const Shape& shape, DType dtype) {
    static double buffer[4096];
    EXPECT_LE(core::shape_numel(shape), 4096);
    return Tensor::borrow(buffer, shape, dtype, core::Device::cuda);
}

void expect_op_error(const std::function<void()>& fn, const std::string& needle, core::ExitCode code) {
    ++comparisons();  // an expected error is a check too (the CUDA entry points' error cases)
    try {
        fn();
        ADD_FAILURE() << "expected an error containing \"" << needle << "\", got none";
    } catch (const core::Error& e) {
        EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.what();
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
            << "expected \"" << needle << "\" in: " << e.what();
    }
}

}  // namespace mt::ops::test
