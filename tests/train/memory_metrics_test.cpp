// The per-step memory figures on the CPU (the process's resident set, core/backend.h): what a step reports, the
// state bytes taken out of the peak, the high-water mark reset, and the memory_warning event (once per crossing).
// The CUDA allocator's figures are checked in gpu_memory_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/backend.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

using mt::testing::fresh_dir;
using mt::testing::tiny_job;
using mt::train::Trainer;

namespace {

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
    std::ifstream in(path);
    std::vector<nlohmann::json> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
}

}  // namespace

TEST(TrainerMemory, StepReportsTheResidentSetAndItsPeak) {
    const std::string dir = fresh_dir("step");
    Trainer trainer(tiny_job(dir, {"run.device=\"cpu\""}), false);
    // f32 on the CPU: the master weights are the forward's weights, one arena counted once.
    const auto& table = trainer.model().params();
    EXPECT_EQ(table.master_arena().storage(), table.param_arena().storage());
    EXPECT_EQ(trainer.state_bytes(),
              static_cast<int64_t>(table.param_arena().nbytes() + table.grad_arena().nbytes()) +
                  trainer.optimizer_state_bytes());
    for (int s = 0; s < 3; ++s) {
        const mt::train::StepResult r = trainer.train_step();
        EXPECT_GT(r.mem_allocated, 0);
        // The resident set as both, read one after the other: equal up to the pages that moved in between.
        EXPECT_NEAR(static_cast<double>(r.mem_reserved), static_cast<double>(r.mem_allocated), 4 << 20);
        EXPECT_GE(r.mem_peak, r.mem_allocated);
        EXPECT_EQ(r.mem_peak_activations, r.mem_peak - trainer.state_bytes());
        EXPECT_GE(r.mem_peak_activations, 0);
        EXPECT_GT(r.mem_reserved_fraction, 0.0);
        EXPECT_LT(r.mem_reserved_fraction, 1.0);
    }
}

TEST(TrainerMemory, CpuPeakResetsToTheResidentSet) {
    if (access("/proc/self/clear_refs", W_OK) != 0) GTEST_SKIP() << "/proc/self/clear_refs is not writable here";
    mt::core::Backend& cpu = mt::core::backend_get(mt::core::Device::cpu);
    const size_t big = size_t{256} << 20;
    cpu.reset_peak();
    const size_t before = cpu.bytes_in_use();
    size_t spike = 0;
    {
        mt::core::Storage block(big, mt::core::Device::cpu);  // zero-filled, so every page is resident
        spike = cpu.peak_bytes();
        EXPECT_GE(spike, before + big * 9 / 10);
    }
    // Freed (glibc returns a block this large to the kernel): the peak stays until reset. The kernel's RSS counters
    // are approximate (per-CPU batches of pages), hence the slack.
    const size_t slack = size_t{8} << 20;
    EXPECT_GE(cpu.peak_bytes() + slack, spike);
    cpu.reset_peak();
    const size_t now = cpu.bytes_in_use();
    EXPECT_LT(cpu.peak_bytes(), spike - big / 2);
    EXPECT_GE(cpu.peak_bytes() + slack, now) << "the high-water mark is never below the resident set";
}

TEST(TrainerMemory, WarningEventOncePerCrossing) {
    for (const bool low : {false, true}) {
        const std::string dir = fresh_dir(low ? "low" : "default");
        std::vector<std::string> o = {"run.device=\"cpu\"", "train.steps=3"};
        // Any process holds more than a billionth of the machine's memory: above it from the first step on.
        if (low) o.push_back("metrics.memory_warning=1e-9");
        Trainer trainer(tiny_job(dir, o), false);
        trainer.run();
        int events = 0, train_lines = 0;
        for (const auto& line : read_jsonl(dir + "/run/metrics.jsonl")) {
            if (line["kind"] == "train") {
                ++train_lines;
                for (const char* key : {"mem/allocated", "mem/reserved", "mem/peak", "mem/peak_activations"})
                    EXPECT_TRUE(line.contains(key)) << key << " missing from " << line.dump();
            }
            if (line["kind"] != "event" || line["event"] != "memory_warning") continue;
            ++events;
            EXPECT_EQ(line["step"], 1);
            EXPECT_GT(line["reserved"].get<int64_t>(), 0);
            EXPECT_GT(line["fraction"].get<double>(), 1e-9);
            EXPECT_NE(line["detail"].get<std::string>().find("metrics.memory_warning"), std::string::npos);
        }
        EXPECT_EQ(train_lines, 3);
        EXPECT_EQ(events, low ? 1 : 0) << "the fraction stays above the threshold: one event at the crossing";
    }
}
