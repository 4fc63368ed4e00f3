// Elastic resume's arithmetic and command rewriting (operations.md §3, §8 "elastic rounding of the world"): the
// world a restart runs on keeps the global batch (grad_accum x data ranks), rounded down when the ranks left do not
// divide it, respecting the model layout, ep and the --min-ranks / --max-ranks bounds; the launch command gets the
// new rank count, host list and grad_accum; hosts parse, bad ones fail naming --hosts; the probe's exit decides.
#include "train/elastic.h"

#include <gtest/gtest.h>

#include "core/error.h"

using mt::train::elastic_launch;
using mt::train::elastic_world;
using mt::train::ElasticLayout;

TEST(Elastic, TheWorldKeepsTheGlobalBatch) {
    const ElasticLayout dp4{.world = 4, .model_size = 1, .ep = 1, .grad_accum = 2};  // 8 micro-batches a step
    auto w = elastic_world(dp4, 2, 1, 4);
    ASSERT_TRUE(w);
    EXPECT_EQ(w->ranks, 2);
    EXPECT_EQ(w->grad_accum, 4);
    EXPECT_FALSE(w->rounded);
    w = elastic_world(dp4, 3, 1, 4);  // 3 does not divide 8: rounded down to 2
    ASSERT_TRUE(w);
    EXPECT_EQ(w->ranks, 2);
    EXPECT_TRUE(w->rounded);
    w = elastic_world(dp4, 16, 1, 4);  // never above --max-ranks
    EXPECT_EQ(w->ranks, 4);
    EXPECT_EQ(w->grad_accum, 2);
    w = elastic_world(dp4, 16, 1, 0);  // no bound: 8 data ranks, one micro-batch each
    EXPECT_EQ(w->ranks, 8);
    EXPECT_EQ(w->grad_accum, 1);
    EXPECT_FALSE(elastic_world(dp4, 1, 2, 4)) << "below --min-ranks";
    // tp 2 x dp 2 with ep 2: the data ranks come in pairs, each world a multiple of tp.
    const ElasticLayout tp2{.world = 8, .model_size = 2, .ep = 2, .grad_accum = 3};  // 4 data ranks, 12 micro
    w = elastic_world(tp2, 7, 1, 8);  // 3 data ranks would divide 12 but ep = 2 wants 2
    ASSERT_TRUE(w);
    EXPECT_EQ(w->ranks, 4);
    EXPECT_EQ(w->data_ranks, 2);
    EXPECT_EQ(w->grad_accum, 6);
}

TEST(Elastic, TheLaunchGetsTheNewWorld) {
    const std::vector<std::string> cmd = {"mpirun",
                                          "--allow-run-as-root",
                                          "-np",
                                          "4",
                                          "--host",
                                          "a:2,b:2",
                                          "build/moetrain",
                                          "train",
                                          "--config",
                                          "j.toml",
                                          "--set",
                                          "train.grad_accum=2"};
    EXPECT_EQ(mt::train::launch_rank_count(cmd), 4);
    const auto out = elastic_launch(cmd, {.ranks = 2, .data_ranks = 2, .grad_accum = 4}, "a:2");
    const std::vector<std::string> want = {"mpirun",
                                           "--allow-run-as-root",
                                           "-np",
                                           "2",
                                           "--host",
                                           "a:2",
                                           "build/moetrain",
                                           "train",
                                           "--config",
                                           "j.toml",
                                           "--set",
                                           "train.grad_accum=2",
                                           "--set",
                                           "train.grad_accum=4",
                                           "--set",
                                           "parallel.dp=0"};
    EXPECT_EQ(out, want);
    const std::vector<std::string> srun = {"srun", "--ntasks=8", "moetrain", "train", "-c", "x.toml"};
    EXPECT_EQ(mt::train::launch_rank_count(srun), 8);
    try {
        elastic_launch({"moetrain", "train", "--config", "x.toml"}, {.ranks = 1, .data_ranks = 1, .grad_accum = 1}, "");
        FAIL() << "a launch without a rank count was rewritten";
    } catch (const mt::core::Error& e) {
        EXPECT_EQ(e.code(), mt::core::ExitCode::usage);
    }
}

TEST(Elastic, HostsAndProbes) {
    const auto hosts = mt::train::elastic_parse_hosts("node1:4,node2:4,node3");
    ASSERT_EQ(hosts.size(), 3u);
    EXPECT_EQ(hosts[1].name, "node2");
    EXPECT_EQ(hosts[1].slots, 4);
    EXPECT_EQ(hosts[2].slots, 1);
    for (const char* bad : {"a:0", ":2", "a:2,,b", "a:x"}) {
        try {
            mt::train::elastic_parse_hosts(bad);
            FAIL() << bad;
        } catch (const mt::core::Error& e) {
            EXPECT_NE(std::string(e.what()).find("--hosts"), std::string::npos) << e.what();
        }
    }
    EXPECT_TRUE(mt::train::elastic_probe("test {host} = up", "up", 5));
    EXPECT_FALSE(mt::train::elastic_probe("test {host} = up", "down", 5));
    EXPECT_FALSE(mt::train::elastic_probe("sleep 10", "x", 0.3)) << "a probe past its time is a failure";
}
