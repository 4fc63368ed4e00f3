// The op-test harness (conventions §1.4, after ggml's test-backend-ops). Each op's test file registers cases: a
// problem builder with odd sizes (1, primes, non-multiples of the kernels' chunk sizes) and seeded inputs from
// Philox. Every registered case runs in these modes, each a GoogleTest suite:
//   OpGrad.<case>    fp64 central finite differences vs the analytic backward (3 random directions and 8 random
//                    coordinates per differentiable input, relative error <= 1e-6), on the loss L = sum(out * R)
//   OpF32.<case>     the f32 forward and backward agree with fp64 by rho = |a - b|_2 / |b|_2 <= the case budget
//                    (a tensor whose f64 rms is below 0.1 is judged against 0.1 rms instead of its own norm)
//   OpThreads.<case> the f32 forward and backward are bitwise the same with 1 and 3 OpenMP threads
// Ops without a backward (adamw_step, global_norm) register hand-computed checks (OpCheck.<case>) instead.
// Parity mode (CPU vs CUDA) is the PARITY HOOK below; it runs once the CUDA ops exist.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace mt::ops::test {

using core::DType;
using core::Shape;
using core::Tensor;

// How the backward delivers an input's gradient (the op headers say which).
enum class GradKind {
    none,         // not differentiable (ids, targets)
    written,      // "=": the harness fills the buffer with NaN first, so an unwritten element fails the check
    accumulated,  // "+=": the harness fills the buffer with random values first and subtracts them afterwards
};

struct OpInput {
    std::string name;
    Tensor value;  // f64 for float inputs (the harness converts to the dtype under test), i32 for indices
    GradKind grad = GradKind::written;
};

// One problem instance. The closures are dtype-generic: they allocate outputs like their inputs.
struct OpProblem {
    std::vector<OpInput> inputs;
    // Runs the op's forward on `in` (one tensor per input, in order) and returns the outputs that enter the loss.
    std::function<std::vector<Tensor>(const std::vector<Tensor>& in)> forward;
    // Runs the op's backward with `dout` (one per forward output) into `grads` (one per input; defined for the
    // inputs whose GradKind is not none, pre-filled by the harness). Saved tensors are recomputed by the closure.
    std::function<void(
        const std::vector<Tensor>& in, const std::vector<Tensor>& dout, const std::vector<Tensor>& grads)>
        backward;
};

struct OpCase {
    std::string op;    // the header's name: "linear" for src/ops/linear.h
    std::string name;  // unique test name, e.g. "linear_n7_k5_m3_bias"
    std::function<OpProblem()> build;
    double f32_budget = 1e-5;  // rho budget of the f32-vs-f64 check
};

// The modes, run on one case (each registered case runs all three as tests).
void op_check_grad(const OpCase& c);
void op_check_f32(const OpCase& c);
void op_check_threads(const OpCase& c);

// Registers a case and its OpGrad / OpF32 / OpThreads tests (call during static initialization).
void op_register(OpCase c);
// Registers a hand-computed check for an op without a backward; the body is a test (OpCheck.<name>).
void op_register_check(const std::string& op, const std::string& name, std::function<void()> body);
// Names of the ops that have at least one registered case or check.
std::set<std::string> op_registered_ops();

// rho = |a - b|_2 / |b|_2 over all elements (0 when both are zero), the parity metric of conventions §1.4.
double op_rho(const Tensor& a, const Tensor& b);

// PARITY HOOK for the CUDA backend issue: parity mode runs a case's forward and backward on CUDA copies of the
// inputs and compares each output and gradient with the CPU reference by op_rho (budgets: 1e-5 f32, 1e-2 bf16),
// registering OpParity.<case> tests labelled gpu. It needs device copies of tensors and CUDA kernels, neither of
// which exists yet, so no OpParity test is registered; the CUDA issue implements it here over the same registry.

// Seeded inputs. Every value is Philox(seed, stream, element), so cases are reproducible on any machine.
Tensor op_randn(const Shape& shape, uint64_t seed, uint64_t stream, double mean = 0.0, double std = 1.0);
Tensor op_uniform(const Shape& shape, uint64_t seed, uint64_t stream, double lo, double hi);
Tensor op_rand_ids(const Shape& shape, uint64_t seed, uint64_t stream, int32_t lo, int32_t hi);  // [lo, hi)
// Seed of a case, from its name.
uint64_t op_seed(const std::string& name);

// New zero tensor with the shape (or given shape) and dtype of t.
Tensor op_like(const Tensor& t);
Tensor op_like(const Tensor& t, const Shape& shape);
// A non-contiguous tensor of the given shape and dtype (a strided view; shape must hold at least two elements).
Tensor op_noncontiguous(const Shape& shape, DType dtype);

// A tensor that claims to live on the CUDA device (a view over a host buffer that is never read), to check the
// device errors of the entry points without a GPU. At most 4096 elements.
Tensor op_cuda_view(const Shape& shape, DType dtype);

// Expects fn to throw mt::core::Error with the given exit code and a message containing `needle`.
void expect_op_error(const std::function<void()>& fn,
                     const std::string& needle,
                     core::ExitCode code = core::ExitCode::internal);

}  // namespace mt::ops::test
