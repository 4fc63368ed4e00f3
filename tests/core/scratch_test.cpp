// Scratch tensors (contents undefined) and the poisoning that every GPU test runs under: the environment below turns
// it on for the whole binary where a GPU is present, so an op that reads a scratch byte it never wrote sees NaN and
// its parity test fails.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"

namespace mt::core {
namespace {

class ScratchPoisonEnvironment : public ::testing::Environment {
   public:
    void SetUp() override {
        if (backend_available(Device::cuda)) backend_get(Device::cuda).set_scratch_poison(true);
    }
};
[[maybe_unused]] const ::testing::Environment* const kScratchPoison =
    ::testing::AddGlobalTestEnvironment(new ScratchPoisonEnvironment);

TEST(TensorScratch, HasTheShapeAndDtypeAskedFor) {
    const Tensor t = Tensor::scratch({3, 5}, DType::f32, Device::cpu);
    EXPECT_EQ(t.shape(), (Shape{3, 5}));
    EXPECT_EQ(t.dtype(), DType::f32);
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.nbytes(), 60u);
}

TEST(GpuScratch, PoisonedScratchIsAllOnesAndZerosStayZero) {
    if (!backend_available(Device::cuda)) GTEST_SKIP() << "no CUDA GPU in this process";
    const Tensor s = Tensor::scratch({1000}, DType::u8, Device::cuda);
    const Tensor z = Tensor::zeros({1000}, DType::u8, Device::cuda);
    std::vector<uint8_t> hs(1000), hz(1000);
    Backend& be = backend_get(Device::cuda);
    be.copy(hs.data(), Device::cpu, s.raw(), Device::cuda, hs.size());
    be.copy(hz.data(), Device::cpu, z.raw(), Device::cuda, hz.size());
    for (size_t i = 0; i < hs.size(); ++i) {
        ASSERT_EQ(hs[i], 0xFF) << i;
        ASSERT_EQ(hz[i], 0) << i;
    }
}

}  // namespace
}  // namespace mt::core
