// The per-layer gradient and weight norms under mpirun (docs/metrics.md, operations.md §6): with the gradients
// reduce-scattered under ZeRO-1 (each rank holds its owned slices) and with tensor parallelism (each rank a shard,
// the norm gains replicated), every layer's norms equal the one-process run's with the same global batch.
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/mpi/mpi_job.h"
#include "parallel/runtime.h"
#include "train/trainer.h"

using mt::testing::data_dir;
using mt::testing::mpi_job;
using mt::testing::shared_dir;
using mt::train::Trainer;

namespace {

void expect_same_layer_norms(const std::vector<std::string>& layout, const char* what) {
    auto& world = mt::parallel::dist_world();
    const std::string data = data_dir(), run = shared_dir(what);
    const int64_t ga = layout.empty() ? 2 * world.size() : 2;  // dp: the one process takes n x the micro-batches
    auto self = mt::parallel::comm_make_self();
    Trainer single(mpi_job(data,
                           run + "/single_r" + std::to_string(world.rank()),
                           {"parallel.dp=1", "train.grad_accum=" + std::to_string(ga)}),
                   false,
                   self.get());
    std::vector<std::string> o = {"train.grad_accum=2"};
    o.insert(o.end(), layout.begin(), layout.end());
    Trainer dist(mpi_job(data, run + "/dist", o), false);
    for (int s = 0; s < 3; ++s) {
        const auto a = single.train_step(), b = dist.train_step();
        ASSERT_EQ(a.layer_grad_sq.size(), b.layer_grad_sq.size());
        for (size_t l = 0; l < a.layer_grad_sq.size(); ++l) {
            EXPECT_NEAR(b.layer_grad_sq[l], a.layer_grad_sq[l], 1e-5 * a.layer_grad_sq[l]) << what << " layer " << l;
            EXPECT_NEAR(b.layer_param_sq[l], a.layer_param_sq[l], 1e-5 * a.layer_param_sq[l]) << what << " layer " << l;
        }
    }
}

}  // namespace

TEST(TrainerMetrics, LayerNormsUnderZeroOneEqualOneProcess) {
    expect_same_layer_norms({}, "dp");
}

TEST(TrainerMetrics, LayerNormsUnderTensorParallelismEqualOneProcess) {
    if (mt::parallel::dist_world().size() != 2) GTEST_SKIP() << "tp = 2 on two ranks";
    expect_same_layer_norms({"parallel.tp=2", "parallel.dp=1"}, "tp");
}
