// Context parallelism end to end under mpirun (long_context.md §7, docs/distributed.md "Context parallelism"): every
// layout the world allows (cp = n; on four ranks also cp = 2 x dp = 2) trains side by side with one process running
// the same global batch, and the loss curve, the gradient norm and the final parameters agree within 1e-5 (relative,
// f32): the attention model with RoPE. A checkpoint written under cp resumes under one process and one written by one
// process resumes under cp.
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/context_parallel.h"
#include "parallel/mpi/layout_match.h"
#include "parallel/mpi/mpi_job.h"
#include "parallel/runtime.h"
#include "train/trainer.h"

using mt::train::Trainer;
using namespace mt::parallel;

namespace {

using mt::testing::expect_layout_matches;
using mt::testing::Layout;
using mt::testing::layout_name;

std::vector<Layout> layouts(int n) {
    std::vector<Layout> out = {{.cp = n}};
    if (n == 4) out.push_back({.dp = 2, .cp = 2});
    return out;
}

// tiny_job's model at the shortest length the largest cp group cuts (2 x 4 x 64 tokens on four ranks).
std::vector<std::string> model(std::vector<std::string> extra = {}) {
    const int64_t seq = cp_granularity(dist_world().size());
    std::vector<std::string> o = {
        "train.seq_len=" + std::to_string(seq), "model.max_seq_len=" + std::to_string(seq), "train.eval_batches=2"};
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
}

}  // namespace

TEST(TrainerCp, AttentionMatchesOneProcess) {
    for (const Layout& l : layouts(dist_world().size()))
        expect_layout_matches(layout_name("attention", l), l, model({"model.attn_pos=\"rope\""}), 8);
}

// Resharding: cp holds no shard of any parameter (every cp rank has the whole model, the first writes it), so a
// checkpoint written under cp = n resumes as one process, and one process's resumes under cp = n: the next steps
// equal the uninterrupted run's.
TEST(TrainerCp, CheckpointsResumeAcrossCpLayouts) {
    const int n = dist_world().size(), rank = dist_world().rank();
    const std::string dir = mt::testing::shared_dir("cp_ckpt"), data = mt::testing::data_dir();
    auto job = [&](const std::string& run, std::vector<std::string> extra) {
        std::vector<std::string> o = model({"model.attn_pos=\"rope\""});
        o.insert(o.end(), {"train.steps=8", "train.grad_accum=2"});
        o.insert(o.end(), extra.begin(), extra.end());
        return mt::testing::mpi_job(data, run, o);
    };
    auto self = comm_make_self();
    std::vector<double> cp_losses, one_losses;
    {
        Trainer t(job(dir + "/cp", {"parallel.cp=" + std::to_string(n)}), false);
        for (int step = 1; step <= 8; ++step) {
            cp_losses.push_back(t.train_step().loss);
            if (step == 4) t.save_checkpoint();
        }
    }
    {
        Trainer t(job(fmt::format("{}/one_r{}", dir, rank), {"parallel.dp=1"}), false, self.get());
        for (int step = 1; step <= 8; ++step) {
            one_losses.push_back(t.train_step().loss);
            if (step == 4) t.save_checkpoint();
        }
    }
    Trainer one(job(fmt::format("{}/resume_r{}", dir, rank), {"parallel.dp=1"}), false, self.get());
    one.load_checkpoint(dir + "/cp/checkpoints/step_00000004");
    Trainer cp(job(dir + "/resume_cp", {"parallel.cp=" + std::to_string(n)}), false);
    cp.load_checkpoint(fmt::format("{}/one_r{}/checkpoints/step_00000004", dir, rank));
    for (int step = 5; step <= 8; ++step) {
        const double a = one.train_step().loss, b = cp.train_step().loss;
        const double expect_a = cp_losses[static_cast<size_t>(step - 1)];
        const double expect_b = one_losses[static_cast<size_t>(step - 1)];
        EXPECT_LT(std::abs(a - expect_a) / expect_a, 1e-5) << "cp -> one process, step " << step;
        EXPECT_LT(std::abs(b - expect_b) / expect_b, 1e-5) << "one process -> cp, step " << step;
    }
}
