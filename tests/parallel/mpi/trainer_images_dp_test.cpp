// Image + text training under data parallelism (issue 30 item 8, docs/multimodal.md): each data-parallel rank
// generates and encodes its own rows of shapes samples, and dp = world follows the one-process run with the same
// global batch (relative difference below 1e-5 in f32), validation included; the replicas stay bitwise equal.
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/mpi/mpi_job.h"
#include "parallel/runtime.h"
#include "train/trainer.h"

using mt::train::Trainer;
using namespace mt::parallel;
using mt::testing::mpi_shapes_job;
using mt::testing::shared_dir;

TEST(TrainerImagesDp, ShapesMatchOneProcessWithTheSameGlobalBatch) {
    const int n = dist_world().size();
    const int64_t ga = 2;
    const std::string dir = shared_dir("shapes");
    auto self = comm_make_self();
    Trainer single(mpi_shapes_job(dir + "/single", {"train.grad_accum=" + std::to_string(ga * n), "parallel.dp=1"}),
                   false,
                   self.get());
    Trainer dp(mpi_shapes_job(dir + "/dp", {"train.grad_accum=" + std::to_string(ga)}), false);
    ASSERT_EQ(dp.dp_size(), n);
    double worst = 0.0;
    for (int step = 1; step <= 5; ++step) {
        const auto a = single.train_step();
        const auto b = dp.train_step();
        const double rel = std::abs(a.loss - b.loss) / std::abs(a.loss);
        worst = std::max(worst, rel);
        EXPECT_LT(rel, 1e-5) << "step " << step << ": one process " << a.loss << ", dp=" << n << " " << b.loss;
        EXPECT_LT(std::abs(a.grad_norm - b.grad_norm) / a.grad_norm, 1e-5) << "step " << step;
    }
    const double va = single.evaluate(), vb = dp.evaluate();
    EXPECT_LT(std::abs(va - vb) / va, 1e-5) << "val loss " << va << " vs " << vb;
    EXPECT_DOUBLE_EQ(single.last_eval_bound(), dp.last_eval_bound());
    if (dist_world().rank() == 0)
        fmt::print("shapes dp={} vs one process, 5 steps: max relative loss difference {:.2e}, val {:.2e}\n",
                   n,
                   worst,
                   std::abs(va - vb) / va);
}
