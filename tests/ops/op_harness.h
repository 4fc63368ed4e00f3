// The op-test harness (conventions §1.4, after ggml's test-backend-ops). Each op's test file registers cases: a
// problem builder with odd sizes (1, primes, non-multiples of the kernels' chunk sizes) and seeded inputs from
// Philox. Every registered case runs in these modes, each a GoogleTest suite:
//   OpGrad.<case>    fp64 central finite differences vs the analytic backward (3 random directions and 8 random
//                    coordinates per differentiable input, relative error <= 1e-6), on the loss L = sum(out * R)
//   OpF32.<case>     the f32 forward and backward agree with fp64 by the parity metric (below) within the case's
//                    f32_budget; a case whose exact result has a zero tensor opts in to an rms floor for all of its
//                    tensors, with a reason (OpParity's floor names its tensors)
//   OpThreads.<case> the f32 forward and backward are bitwise the same with 1 and 3 OpenMP threads
//   OpParity.<case>  CPU (f32) against CUDA (bf16 and f32 device inputs) by the parity metric (see
//                    op_check_parity); CTest label gpu; skipped where no GPU is present; registered only for a case
//                    with at least one device dtype, and a run that compared no tensor fails
// The parity metric of every mode has two parts (op_parity_error): rho = |a - b|_2 / |b|_2 <= budget over the whole
// tensor, and max_i |a_i - b_i| / rms(b) <= kMaxAbsFactor * budget, so that one element far off in a large tensor
// (which rho dilutes by sqrt(n)) fails too.
// Ops without a backward (adamw_step, global_norm) register hand-computed checks (OpCheck.<case>) instead, and
// their own parity checks with op_register_parity_check.
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

// How far max |a_i - b_i| may go, in units of the reference rms, per unit of rho budget.
inline constexpr double kMaxAbsFactor = 20.0;

// How a case runs in parity mode (conventions §1.4). The CUDA side runs once per enabled device dtype D: float
// inputs are rounded to D and copied to the device, and the CPU reference runs in f32 on the same rounded values,
// so the comparison measures the kernels, not the rounding of the inputs.
struct OpParityOptions {
    bool bf16 = true;           // run with bf16 device inputs (activations and weights in bf16)
    bool f16 = true;            // run with f16 device inputs (the fp16 training mode)
    bool f32 = true;            // run with f32 device inputs
    double bf16_budget = 1e-2;  // rho budgets (f16 runs use bf16_budget: f16 rounds 8x finer); a case that changes one
                                // says why in budget_reason
    double f32_budget = 1e-5;
    std::string budget_reason;
    // A reference tensor whose rms is below this is judged against this rms instead of its own norm (see
    // op_parity_error); a case raises it, with a reason, for a tensor that is exactly zero in exact arithmetic, and
    // names those tensors in floor_tensors ("output 0", "dq", ...; empty: every tensor).
    double rms_floor = 1e-6;
    std::vector<std::string> floor_tensors = {};
    // max-abs may reach max_abs_factor x the budget (kMaxAbsFactor unless a case says why, in budget_reason, for
    // the tensors in max_abs_tensors; empty: every tensor).
    double max_abs_factor = kMaxAbsFactor;
    std::vector<std::string> max_abs_tensors = {};
    // Dtype of the "+=" gradient buffers (parameter grads) in the bf16 and f16 runs: f32 by default, as Megatron's
    // main_grad (a bf16 forward accumulates its parameter gradients in f32). The f32 run uses f32 for every buffer.
    DType bf16_accumulated_grad = DType::f32;
    // Or, where set, those buffers in the input's own dtype (bf16 in the bf16 run, f16 in the f16 run): for ops whose
    // "+=" gradient must match its input (an accumulated dx).
    bool accumulated_grad_in_input_dtype = false;
};

struct OpCase {
    std::string op;    // the header's name: "linear" for src/ops/linear.h
    std::string name;  // unique test name, e.g. "linear_n7_k5_m3_bias"
    std::function<OpProblem()> build;
    double f32_budget = 1e-5;  // rho budget of the f32-vs-f64 check
    // The f32-vs-f64 check's rms floor (as OpParityOptions::rms_floor): a case that raises it above the default
    // (0.1 for a tensor that is exactly zero in exact arithmetic, so that f32 returns rounding noise) says why.
    double f32_rms_floor = 1e-6;
    std::string f32_floor_reason = {};
    OpParityOptions parity = {};
    // A large case for the CUDA kernels (vector widths, tiles, V = 32768+): registered as OpParity only, since the
    // fp64 finite differences of the CPU modes would be slow at that size and the small cases cover them.
    bool parity_only = false;
};

// The case, marked parity_only.
inline OpCase op_parity_only(OpCase c) {
    c.parity_only = true;
    return c;
}

// The modes, run on one case (each registered case runs all four as tests).
void op_check_grad(const OpCase& c);
void op_check_f32(const OpCase& c);
void op_check_threads(const OpCase& c);
// Parity mode: for each enabled device dtype, the forward outputs and every gradient of the CUDA run against the
// CPU f32 run, by op_parity_rho, within the case's budget. Each comparison prints one line
//   [ PARITY ] <case> <dtype> <tensor>: rho 1.234e-03 (budget 1e-02)
// An op whose CUDA side fails (not implemented yet, a CUDA error) fails the test with that error's message. The
// caller skips when no GPU is present (the registered tests do).
void op_check_parity(const OpCase& c);

// Registers a case and its OpGrad / OpF32 / OpThreads / OpParity tests (only OpParity for a parity_only case; no
// OpParity for a case with every device dtype off; call during static initialization).
void op_register(OpCase c);
// Registers a hand-computed check for an op without a backward; the body is a test (OpCheck.<name>).
void op_register_check(const std::string& op, const std::string& name, std::function<void()> body);
// Registers a parity check of an op without a backward (OpParity.<name>, label gpu); the body runs only where a GPU
// is present and compares with op_expect_parity.
void op_register_parity_check(const std::string& op, const std::string& name, std::function<void()> body);
// Names of the ops that have at least one registered case or check.
std::set<std::string> op_registered_ops();

// rho = |a - b|_2 / |b|_2 over all elements (0 when both are zero), the parity metric of conventions §1.4. Either
// tensor may be on any device and of any dtype (device tensors are copied to the host).
double op_rho(const Tensor& a, const Tensor& b);

// The parity metric of one tensor against its reference: rho as op_rho and the largest elementwise error, both
// relative to the reference's rms, except that a reference whose rms is below rms_floor is judged against that rms
// (a tensor that is exactly zero in exact arithmetic is rounding noise in f32 and bf16). NaN anywhere gives NaN.
struct ParityError {
    double rho = 0.0;
    double max_abs = 0.0;  // max_i |got_i - ref_i| / max(rms(ref), rms_floor)
    bool within(double budget, double max_abs_factor = kMaxAbsFactor) const {
        return rho <= budget && max_abs <= max_abs_factor * budget;
    }
};
ParityError op_parity_error(const Tensor& got, const Tensor& ref, double rms_floor = 1e-6);
// Its rho alone.
double op_parity_rho(const Tensor& got, const Tensor& ref, double rms_floor = 1e-6);
// Prints the [ PARITY ] line for one tensor and expects op_parity_error within budget; counts the comparison.
void op_expect_parity(const std::string& name,
                      const std::string& what,
                      const Tensor& got,
                      const Tensor& ref,
                      double budget,
                      double rms_floor = 1e-6,
                      double max_abs_factor = kMaxAbsFactor);

// True when the two tensors hold the same number of bytes and the same bytes (either may be on any device: device
// tensors are copied to the host), the check of deterministic and bit-for-bit results.
bool op_same_bytes(const Tensor& a, const Tensor& b);

// Checks made so far in this process: op_expect_parity comparisons and expect_op_error calls (the harness fails a
// parity test that made none).
int64_t op_parity_comparisons();

// True where CUDA ops can run (a CUDA build and a visible GPU); parity tests skip otherwise with
// kOpNoGpuMessage.
bool op_gpu_available();
inline constexpr const char* kOpNoGpuMessage = "no CUDA device: parity tests need a GPU";

// Seeded inputs. Every value is Philox(seed, stream, element), so cases are reproducible on any machine.
Tensor op_randn(const Shape& shape, uint64_t seed, uint64_t stream, double mean = 0.0, double std = 1.0);
Tensor op_uniform(const Shape& shape, uint64_t seed, uint64_t stream, double lo, double hi);
Tensor op_rand_ids(const Shape& shape, uint64_t seed, uint64_t stream, int32_t lo, int32_t hi);  // [lo, hi)
// Seed of a case, from its name.
uint64_t op_seed(const std::string& name);

// New zero tensor with the shape (or given shape), dtype and device of t.
Tensor op_like(const Tensor& t);
Tensor op_like(const Tensor& t, const Shape& shape);
// New zero tensor for a saved statistic or a loss (rstd, lse, losses) computed from t: f32 where t is bf16 or f16
// (statistics stay in f32 on the GPU), t's dtype otherwise; t's device.
Tensor op_stat_like(const Tensor& t, const Shape& shape);
// A non-contiguous tensor of the given shape and dtype (a strided view; shape must hold at least two elements).
Tensor op_noncontiguous(const Shape& shape, DType dtype);

// A tensor that claims to live on the CUDA device (a view over a host buffer that is never read), to check the
// device errors of the entry points without a GPU (mixed-device calls, which fail before any kernel runs; never
// pass it to a call whose tensors are all on cuda). At most 4096 elements.
Tensor op_cuda_view(const Shape& shape, DType dtype);

// Expects fn to throw mt::core::Error with the given exit code and a message containing `needle`.
void expect_op_error(const std::function<void()>& fn,
                     const std::string& needle,
                     core::ExitCode code = core::ExitCode::internal);

}  // namespace mt::ops::test
