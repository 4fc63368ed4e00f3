// The harness judges itself: the parity metric sees one wrong element that rho alone dilutes, the rms floor applies
// only where a case asks for it, and a parity test that compared nothing fails. CPU only (no device run happens).
#include "op_harness.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace mt::ops::test {
namespace {

// A 1024 x 768 reference of unit rms and a copy with one element 5 rms off.
std::pair<Tensor, Tensor> one_element_off(double off) {
    const Tensor ref = op_randn({1024, 768}, 3, 1).to(DType::f32);
    Tensor got = ref.clone();
    core::tensor_set_flat(got, 4321, core::tensor_get_flat(got, 4321) + off);
    return {got, ref};
}

TEST(OpHarness, MaxAbsSeesOneWrongElement) {
    const auto [got, ref] = one_element_off(5.0);
    const ParityError e = op_parity_error(got, ref);
    // rho = 5 / sqrt(n) = 5.7e-3: inside the bf16 budget; max-abs = 5 rms: 25x the budget's 0.2 rms.
    EXPECT_NEAR(e.rho, 5.0 / std::sqrt(1024.0 * 768.0), 1e-4);
    EXPECT_LE(e.rho, 1e-2);
    EXPECT_NEAR(e.max_abs, 5.0, 0.05);
    EXPECT_FALSE(e.within(1e-2));
    EXPECT_NONFATAL_FAILURE(op_expect_parity("case", "bf16 output 0", got, ref, 1e-2), "largest element error");
    // Rounding-sized differences everywhere pass both parts.
    Tensor noisy = ref.clone();
    const Tensor noise = op_randn({1024, 768}, 3, 2, 0.0, 1e-3).to(DType::f32);
    for (int64_t i = 0; i < noisy.numel(); ++i)
        core::tensor_set_flat(noisy, i, core::tensor_get_flat(ref, i) + core::tensor_get_flat(noise, i));
    EXPECT_TRUE(op_parity_error(noisy, ref).within(1e-2));
}

TEST(OpHarness, NanFailsAndFloorIsOnlyWhereAsked) {
    auto [got, ref] = one_element_off(0.0);
    core::tensor_set_flat(got, 7, std::numeric_limits<double>::quiet_NaN());
    EXPECT_FALSE(op_parity_error(got, ref).within(1e-2));
    // An exactly-zero reference against noise of 1e-7: rho 0.1 against the default floor of 1e-6 (so a wrong zero
    // fails), 1e-4 against a floor of 1e-3.
    const Tensor zero = Tensor::zeros({64}, DType::f32);
    Tensor tiny = zero.clone();
    for (int64_t i = 0; i < 64; ++i) core::tensor_set_flat(tiny, i, i % 2 ? 1e-7 : -1e-7);
    EXPECT_GT(op_parity_error(tiny, zero).rho, 0.05);
    EXPECT_NEAR(op_parity_error(tiny, zero, 1e-3).rho, 1e-4, 1e-6);
}

TEST(OpHarness, ParityThatComparedNothingFails) {
    // A case with every device dtype off: op_check_parity runs no device pass and must say it compared nothing
    // (op_register does not even register such a case).
    OpCase c{"add", "harness_nothing", [] {
                 OpProblem p;
                 p.inputs = {{"x", op_randn({3}, 1, 1), GradKind::written}};
                 p.forward = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; };
                 p.backward = [](const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>&) {};
                 return p;
             }};
    c.parity.bf16 = c.parity.f16 = c.parity.f32 = false;
    EXPECT_NONFATAL_FAILURE(op_check_parity(c), "compared no tensor");
}

}  // namespace
}  // namespace mt::ops::test
