// The memory planner's state bytes against real Trainers under mpirun: for data parallelism (dp = n), expert
// parallelism (ep = n) and, on four ranks, ep = 2 x dp = 2, with ZeRO-1 on and off, every rank's Trainer holds exactly
// the planned state (Trainer::state_bytes) and optimizer state (Trainer::optimizer_state_bytes).
#include <gtest/gtest.h>

#include "parallel/mpi/mpi_job.h"
#include "parallel/plan_memory.h"
#include "parallel/runtime.h"
#include "train/plan_input.h"
#include "train/trainer.h"

using mt::testing::data_dir;
using mt::testing::shared_dir;

TEST(PlanMemoryMpi, EveryRankHoldsThePlannedState) {
    const int n = mt::parallel::dist_world().size();
    std::vector<std::pair<int, int>> layouts = {{1, n}, {n, 1}};  // {ep, dp}
    if (n == 4) layouts.emplace_back(2, 2);
    for (const auto& [ep, dp] : layouts) {
        for (int zero : {1, 0}) {
            SCOPED_TRACE(fmt::format("ep={} dp={} zero_stage={}", ep, dp, zero));
            const mt::train::JobConfig cfg = mt::testing::mpi_job(data_dir(),
                                                                  shared_dir("plan"),
                                                                  {"moe.enabled=true",
                                                                   "moe.num_experts=8",
                                                                   "moe.top_k=2",
                                                                   "moe.expert_ffn_dim=16",
                                                                   "parallel.bucket_mb=0.001",
                                                                   "parallel.ep=" + std::to_string(ep),
                                                                   "parallel.dp=" + std::to_string(dp),
                                                                   "parallel.zero_stage=" + std::to_string(zero)});
            const mt::train::Trainer trainer(cfg, false);
            const mt::parallel::MemoryPlan plan = mt::parallel::plan_memory(mt::train::plan_memory_input(cfg, n));
            EXPECT_EQ(plan.state_bytes(), trainer.state_bytes()) << "rank " << mt::parallel::dist_world().rank();
            EXPECT_EQ(plan.optimizer, trainer.optimizer_state_bytes()) << "rank " << mt::parallel::dist_world().rank();
            EXPECT_EQ(plan.buckets, trainer.gradient_buckets());
            EXPECT_EQ(plan.zero, zero == 1);
            if (mt::parallel::dist_world().rank() == 0)
                fmt::print("plan ep={} dp={} zero_stage={}: state {} bytes, optimizer {} bytes per rank\n",
                           ep,
                           dp,
                           zero,
                           plan.state_bytes(),
                           plan.optimizer);
        }
    }
}
