// optim.name = "muon" under data (and expert) parallelism (muon.md §9 test 4): every rank of the group keeps every
// matrix's momentum and runs its Newton-Schulz on the all-reduced gradient (replicated Muon, parallel.zero_stage = 0;
// whole-matrix ownership is the next step), so the losses, gradient norms and the parameters after 10 steps equal one
// process's (loss and norm within 1e-5, parameters rho <= 1e-6): dp = n, and on four ranks dp = 2 x ep = 2 with MoE.
#include <gtest/gtest.h>

#include "parallel/mpi/layout_match.h"

using namespace mt::testing;

TEST(TrainerMuon, DataParallelEqualsOneProcess) {
    const int n = dist_world().size();
    std::vector<Layout> layouts = {{.dp = n}};
    if (n == 4) layouts.push_back({.dp = 2, .ep = 2});
    for (const Layout& l : layouts) {
        std::vector<std::string> keys = {"optim.name=\"muon\"", "parallel.zero_stage=0", "train.lr=5e-3"};
        if (l.ep > 1)
            keys.insert(keys.end(), {"moe.enabled=true", "moe.num_experts=4", "moe.top_k=2", "moe.expert_ffn_dim=16"});
        expect_layout_matches(layout_name("muon", l), l, keys, 10, 1e-6);
    }
}
