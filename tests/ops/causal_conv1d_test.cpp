// Harness cases and argument checks of the causal depthwise conv (ops/causal_conv1d.h): widths 1 to 8, T shorter
// than the width, with and without SiLU, and with a document-start map (documents every `doc` tokens, so the CUDA
// kernels' own masking is held to the CPU's per-document split); a check against the definition written out. The
// CUDA kernels tile time by 64 tokens a thread and 256 a block, and channels by 64 (even C) or 32 (odd C) a warp
// (src/ops/cuda/kda/causal_conv1d.cu): the larger cases put T, C and document starts on and off those edges.
#include "ops/causal_conv1d.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kda_inputs.h"
#include "op_harness.h"
#include "support/documents.h"

namespace mt::ops::test {
namespace {

// The host map on x's device (undefined stays undefined).
Tensor docs_on(const Tensor& host_docs, const Tensor& x) {
    return host_docs.defined() ? host_docs.to_device(x.device()) : Tensor();
}

// doc > 0: documents start at 0, doc, 2 doc, ... in every row (a map as the model builds it).
Tensor every_doc_map(int64_t b, int64_t t, int64_t doc) {
    std::vector<std::vector<int64_t>> starts(static_cast<size_t>(b));
    for (auto& row : starts)
        for (int64_t s = 0; s < t; s += doc) row.push_back(s);
    return mt::testing::doc_start_map(starts, t);
}

OpCase conv_case(int64_t b, int64_t t, int64_t c, int64_t width, bool silu, int64_t doc = 0) {
    const std::string name = fmt::format("causal_conv1d_b{}_t{}_c{}_w{}{}{}",
                                         b,
                                         t,
                                         c,
                                         width,
                                         silu ? "_silu" : "",
                                         doc ? fmt::format("_doc{}", doc) : "");
    const Tensor host_docs = doc > 0 ? every_doc_map(b, t, doc) : Tensor();
    OpCase oc{"causal_conv1d", name, [=] {
                  const uint64_t s = op_seed(name);
                  OpProblem p;
                  p.inputs = {{"x", op_randn({b, t, c}, s, 0), GradKind::written},
                              {"w", op_randn({c, width}, s, 1, 0.0, 0.5), GradKind::accumulated}};
                  p.forward = [=](const std::vector<Tensor>& in) {
                      const Tensor y = op_like(in[0]);
                      causal_conv1d_fwd(in[0], in[1], y, silu, docs_on(host_docs, in[0]));
                      return std::vector<Tensor>{y};
                  };
                  p.backward = [=](const std::vector<Tensor>& in,
                                   const std::vector<Tensor>& dout,
                                   const std::vector<Tensor>& grads) {
                      causal_conv1d_bwd(in[0], in[1], dout[0], grads[0], grads[1], silu, docs_on(host_docs, in[0]));
                  };
                  return p;
              }};
    op_parity_on(oc, 1e-2, 1e-5, "default budgets");
    return oc;
}

// The case with a bf16 dw in the bf16 and f16 parity runs (f32 by default: bf16 activations keep f32 parameter
// gradients), so the kernels' rounding of the accumulated dw is checked too.
OpCase with_bf16_dw(OpCase c) {
    c.name += "_dwbf16";
    c.parity.bf16_accumulated_grad = DType::bf16;
    return c;
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(conv_case(1, 1, 1, 4, true));
    op_register(conv_case(2, 3, 5, 4, true));  // T < width
    op_register(conv_case(2, 11, 7, 4, true));
    op_register(conv_case(1, 9, 3, 1, false));
    op_register(conv_case(3, 13, 17, 2, false));
    op_register(conv_case(4, 70, 130, 4, true));  // large enough for the OpenMP team
    // Document masking: documents shorter than the width, and longer.
    op_register(conv_case(2, 11, 7, 4, true, 2));
    op_register(conv_case(3, 40, 33, 4, false, 7));
    op_register(conv_case(2, 300, 64, 4, true, 37));
    // The CUDA tiles: T past a block of 256 by 44 and by 1, C = 130 (two 64-channel spans and a 2-channel one) and odd
    // C (one channel a thread), T = 2 < W with even C, widths 3 (inside the 4-tap window) and 5 to 8 (the 8-tap one).
    op_register(conv_case(2, 300, 130, 4, true));
    op_register(conv_case(2, 300, 130, 4, false, 61));  // documents across thread and block tiles
    op_register(conv_case(1, 257, 33, 4, false));
    op_register(conv_case(3, 2, 6, 4, true));
    op_register(conv_case(3, 129, 66, 3, true, 64));   // documents starting on thread tiles
    op_register(conv_case(2, 520, 64, 4, true, 256));  // documents starting on block tiles
    op_register(conv_case(2, 200, 31, 4, true, 1));    // one-token documents: every tap but the last masked
    op_register(conv_case(2, 150, 9, 6, true, 13));
    op_register(conv_case(1, 70, 4, 8, false));
    op_register(conv_case(2, 5, 3, 8, true));
    op_register(with_bf16_dw(conv_case(2, 300, 66, 4, true, 50)));
    // Many blocks along time and channels, every row split into documents (CUDA only: large for the fp64 modes).
    op_register(op_parity_only(conv_case(3, 1100, 258, 4, true, 300)));
    op_register(op_parity_only(conv_case(2, 700, 515, 4, false)));
    return true;
}();

TEST(OpCheck, CausalConv1dMatchesDefinition) {
    const int64_t b = 2, t = 9, c = 3, width = 4;
    const Tensor x = op_randn({b, t, c}, 5, 0), w = op_randn({c, width}, 5, 1), y = op_like(x);
    causal_conv1d_fwd(x, w, y, true);
    double worst = 0;
    for (int64_t bb = 0; bb < b; ++bb) {
        for (int64_t tt = 0; tt < t; ++tt) {
            for (int64_t ch = 0; ch < c; ++ch) {
                double z = 0;
                for (int64_t tau = 0; tau < width; ++tau) {
                    const int64_t src = tt - (width - 1) + tau;
                    if (src >= 0) z += w.at({ch, tau}) * x.at({bb, src, ch});
                }
                worst = std::max(worst, std::fabs(y.at({bb, tt, ch}) - z / (1 + std::exp(-z))));
            }
        }
    }
    EXPECT_LT(worst, 1e-14);
}

TEST(OpArgs, CausalConv1dShapes) {
    const Tensor x = Tensor::zeros({2, 5, 3}, DType::f32), w = Tensor::zeros({3, 4}, DType::f32), y = op_like(x);
    causal_conv1d_fwd(x, w, y, true);
    expect_op_error(
        [&] {
            causal_conv1d_fwd(x, Tensor::zeros({4, 4}, DType::f32), y, true);
        },
        "causal_conv1d_fwd: w has shape [4, 4] but x has 3 channels; w must be [C, W]");
    expect_op_error(
        [&] {
            causal_conv1d_fwd(x, w, Tensor::zeros({2, 5, 4}, DType::f32), true);
        },
        "causal_conv1d_fwd: y has shape [2, 5, 4], expected [2, 5, 3]");
    expect_op_error([&] { causal_conv1d_fwd(x, w.to(DType::f64), y, true); },
                    "causal_conv1d_fwd: w has dtype f64, expected f32 (the dtype of x)");
    expect_op_error(
        [&] {
            causal_conv1d_bwd(x, w, y, op_like(x), Tensor::zeros({3, 5}, DType::f32), true);
        },
        "causal_conv1d_bwd: dw has shape [3, 5], expected [3, 4]");
}

}  // namespace
}  // namespace mt::ops::test
