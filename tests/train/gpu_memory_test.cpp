// The per-step memory figures on the GPU: a step's mem/peak is the caching allocator's peak of that step (in the
// StepResult and in metrics.jsonl), reset as each step starts, and the state bytes taken out of it are the arenas
// of the mixed-precision model. Skipped without a GPU (label gpu); the CPU figures are in memory_metrics_test.cpp.
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "support/gpu_compare.h"
#include "support/tiny_job.h"

using mt::testing::fresh_dir;
using mt::testing::tiny_job;
using mt::train::Trainer;
using GpuMemory = mt::testing::GpuTrainingTest;  // skips before any CUDA call when no GPU is visible

TEST_F(GpuMemory, StepPeakIsTheAllocatorsAndResets) {
    const std::string dir = fresh_dir("step");
    Trainer trainer(tiny_job(dir, {"run.device=\"cuda\""}), false);
    mt::core::Backend& gpu = mt::core::backend_get(mt::core::Device::cuda);
    // bf16 mixed precision: the bf16 weights, the f32 master weights and f32 gradients are three arenas.
    const auto& table = trainer.model().params();
    ASSERT_NE(table.master_arena().storage(), table.param_arena().storage());
    EXPECT_EQ(trainer.state_bytes(),
              static_cast<int64_t>(table.param_arena().nbytes() + table.master_arena().nbytes() +
                                   table.grad_arena().nbytes()) +
                  trainer.optimizer_state_bytes());

    const mt::train::StepResult first = trainer.train_step();
    EXPECT_EQ(first.mem_peak, static_cast<int64_t>(gpu.peak_bytes()));
    EXPECT_EQ(first.mem_allocated, static_cast<int64_t>(gpu.bytes_in_use()));
    EXPECT_EQ(first.mem_reserved, static_cast<int64_t>(gpu.reserved_bytes()));
    EXPECT_GE(first.mem_peak, first.mem_allocated);
    EXPECT_GE(first.mem_reserved, first.mem_peak) << "the blocks of the peak are still held, in use or cached";
    EXPECT_EQ(first.mem_peak_activations, first.mem_peak - trainer.state_bytes());
    EXPECT_GT(first.mem_peak_activations, 0);
    EXPECT_LT(first.mem_peak_activations, first.mem_peak);
    EXPECT_GT(first.mem_reserved_fraction, 0.0);
    EXPECT_LT(first.mem_reserved_fraction, 1.0);
    EXPECT_EQ(first.mem_reserved_fraction,
              static_cast<double>(gpu.reserved_bytes()) / static_cast<double>(gpu.total_bytes()));

    // reset_peak: the peak falls back to what is in use now, and follows a new block from there.
    const size_t spike = size_t{512} << 20;  // a multiple of the 2 MiB size class: held exactly
    gpu.reset_peak();
    EXPECT_EQ(gpu.peak_bytes(), gpu.bytes_in_use());
    const size_t in_use = gpu.bytes_in_use();
    { mt::core::Storage block(spike, mt::core::Device::cuda); }
    gpu.synchronize();
    EXPECT_EQ(gpu.peak_bytes(), in_use + spike);
    // The next step starts with a reset: its peak is its own, far below the spike left from before it.
    const mt::train::StepResult second = trainer.train_step();
    EXPECT_EQ(second.mem_peak, static_cast<int64_t>(gpu.peak_bytes()));
    EXPECT_LT(second.mem_peak, static_cast<int64_t>(in_use + spike));
    EXPECT_GE(second.mem_peak, second.mem_allocated);
}

TEST_F(GpuMemory, MetricsLineHoldsTheStepsPeak) {
    const std::string dir = fresh_dir("jsonl");
    Trainer trainer(tiny_job(dir, {"run.device=\"cuda\"", "train.steps=3"}), false);
    trainer.run();  // no checkpoint or evaluation after the last step (tiny_job): nothing allocates after it
    const mt::core::Backend& gpu = mt::core::backend_get(mt::core::Device::cuda);
    std::ifstream in(dir + "/run/metrics.jsonl");
    nlohmann::json last;
    int lines = 0;
    for (std::string text; std::getline(in, text);) {
        const auto line = nlohmann::json::parse(text);
        if (line["kind"] != "train") continue;
        ++lines;
        last = line;
        EXPECT_GE(line["mem/peak"].get<int64_t>(), line["mem/allocated"].get<int64_t>());
        EXPECT_GT(line["mem/peak_activations"].get<int64_t>(), 0);
    }
    ASSERT_EQ(lines, 3);
    EXPECT_EQ(last["mem/peak"].get<int64_t>(), static_cast<int64_t>(gpu.peak_bytes()));
    EXPECT_EQ(last["mem/reserved"].get<int64_t>(), static_cast<int64_t>(gpu.reserved_bytes()));
}
