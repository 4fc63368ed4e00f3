// The shared backward workspace: a slot is one grow-only buffer whose typed views every layer's backward shares.
#include "nn/workspace.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace mt::nn {
namespace {

using core::Device;
using core::DType;

TEST(Workspace, ViewsOfOneSlotShareItsBufferAndItGrowsOnlyWhenTooSmall) {
    Workspace ws;
    const core::Tensor a = ws.slot(0, {4, 8}, DType::f32, Device::cpu);
    const core::Tensor b = ws.slot(0, {16}, DType::bf16, Device::cpu);  // 32 bytes of the 128: the same memory
    EXPECT_EQ(a.raw(), b.raw());
    EXPECT_EQ(b.shape(), (core::Shape{16}));
    EXPECT_EQ(b.dtype(), DType::bf16);
    EXPECT_EQ(ws.slot_bytes(), 128u);
    const core::Tensor other = ws.slot(1, {4}, DType::f32, Device::cpu);
    EXPECT_NE(other.raw(), a.raw());
    const core::Tensor big = ws.slot(0, {64}, DType::f32, Device::cpu);  // grows: 256 bytes
    EXPECT_EQ(ws.slot_bytes(), 256u + 16u);
    EXPECT_EQ(big.numel(), 64);
    EXPECT_EQ(a.data<float>()[0], a.data<float>()[0]);  // the old view still owns its (old) buffer
}

TEST(Workspace, AReservedSlotIsAllocatedOnceAtItsLargestSize) {
    Workspace ws;
    ws.reserve_slot(2, 1000);
    ws.reserve_slot(2, 400);  // a smaller reservation changes nothing
    const core::Tensor first = ws.slot(2, {10}, DType::f32, Device::cpu);
    EXPECT_EQ(ws.slot_bytes(), 1000u);
    const core::Tensor second = ws.slot(2, {250}, DType::f32, Device::cpu);  // 1000 bytes: no growth
    EXPECT_EQ(first.raw(), second.raw());
}

TEST(Workspace, ASlotOutsideTheTableIsACallersBug) {
    Workspace ws;
    EXPECT_THROW(ws.slot(Workspace::kSlots, {1}, DType::f32, Device::cpu), core::Error);
    EXPECT_THROW(ws.reserve_slot(-1, 8), core::Error);
}

}  // namespace
}  // namespace mt::nn
