// CUDA graphs (train.cuda_graphs, docs/training.md "CUDA graphs"): a run whose training steps replay captured
// graphs gives the same losses and the same final parameters and optimizer state, bit for bit, as the same run
// without them, for the dense tiny model, the KDA hybrid, AttnRes (with the residual blend changing every step, so
// that the graphs are captured again), full recompute, packed documents (document masking: new maps every batch)
// and two micro-batches per step. Skipped without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/gpu_compare.h"
#include "support/tiny_job.h"
#include "train/checkpoint_io.h"

using mt::testing::fresh_dir;
using mt::testing::latest_checkpoint;
using mt::testing::losses;
using mt::testing::tiny_job;
using mt::train::Trainer;
using GpuGraphs = mt::testing::GpuTrainingTest;

namespace {

struct GraphRun {
    std::vector<double> losses;
    int64_t captures = 0, replays = 0;
};

GraphRun run(const std::string& dir, std::vector<std::string> o, bool graphs, int64_t steps) {
    o.push_back(std::string("train.cuda_graphs=") + (graphs ? "true" : "false"));
    o.push_back("run.dir=\"" + dir + (graphs ? "/graphs" : "/eager") + "\"");
    Trainer t(tiny_job(dir, o), false);
    GraphRun r;
    r.losses = losses(t, steps);
    r.captures = t.model().graph_captures();
    r.replays = t.model().graph_replays();
    t.save_checkpoint();
    return r;
}

}  // namespace

TEST_F(GpuGraphs, ReplayedStepsEqualEagerOnesBitForBit) {
    constexpr int64_t kSteps = 6;  // tiny_job: 2 micro-batches per step
    const std::vector<std::string> base = {"run.device=\"cuda\"", "run.precision=\"bf16\""};
    // Packed documents that change from batch to batch: the replays read each batch's maps in place.
    const std::string docs = mt::testing::write_document_shard(fresh_dir("graphs_documents_data"));
    struct Variant {
        const char* name;
        std::vector<std::string> extra;
        bool recaptures;  // what the graphs bake in changes from step to step
    };
    const std::vector<Variant> variants = {
        {"dense", {}, false},
        {"kda_hybrid", {"model.layer_pattern=\"KA\""}, false},
        {"attnres_blend",
         {"model.layer_pattern=\"KA\"",
          "attnres.mode=\"block\"",
          "attnres.block_size=3",
          "attnres.residual_blend=0.5",
          "attnres.residual_blend_steps=4"},
         true},
        {"full_recompute", {"recompute.policy=\"full\""}, false},
        {"documents", {"data.paths=[\"" + docs + "\"]", "data.document_mask=true", "data.eot_token=60"}, false},
    };
    for (const Variant& v : variants) {
        const std::string dir = fresh_dir(std::string("graphs_") + v.name);
        std::vector<std::string> o = base;
        o.insert(o.end(), v.extra.begin(), v.extra.end());
        const GraphRun eager = run(dir, o, false, kSteps);
        const GraphRun graphs = run(dir, o, true, kSteps);
        ASSERT_EQ(eager.losses.size(), graphs.losses.size()) << v.name;
        for (size_t i = 0; i < eager.losses.size(); ++i)
            EXPECT_EQ(eager.losses[i], graphs.losses[i]) << v.name << ": step " << i + 1;
        EXPECT_EQ(eager.captures, 0) << v.name;
        // The first micro-batch runs eagerly; every later forward replays, or captures and then launches.
        EXPECT_EQ(graphs.captures + graphs.replays, 2 * kSteps - 1) << v.name;
        if (v.recaptures)
            EXPECT_GT(graphs.captures, 1) << v.name;
        else
            EXPECT_EQ(graphs.captures, 1) << v.name;
        std::printf("%s: %lld captures, %lld replays, loss %.4f -> %.4f\n",
                    v.name,
                    static_cast<long long>(graphs.captures),
                    static_cast<long long>(graphs.replays),
                    graphs.losses.front(),
                    graphs.losses.back());
        const int n = mt::testing::expect_checkpoints_identical(
            latest_checkpoint(dir + "/eager"), latest_checkpoint(dir + "/graphs"), v.name);
        EXPECT_GT(n, 0) << v.name;
    }
}

// An evaluation between steps (an eager forward that may move the buffers the graphs use) drops them; the next
// training step captures again, and the run still equals the one without graphs.
TEST_F(GpuGraphs, EvaluationBetweenStepsDropsAndRecaptures) {
    const std::string dir = fresh_dir("graphs_eval");
    const std::vector<std::string> o = {"run.device=\"cuda\"", "train.eval_every=2", "train.steps=6"};
    std::vector<double> eager_val, graph_val;
    int64_t captures = 0;
    std::vector<double> eager_losses, graph_losses;
    for (const bool graphs : {false, true}) {
        std::vector<std::string> oo = o;
        oo.push_back(std::string("train.cuda_graphs=") + (graphs ? "true" : "false"));
        oo.push_back("run.dir=\"" + dir + (graphs ? "/graphs" : "/eager") + "\"");
        Trainer t(tiny_job(dir, oo), false);
        std::vector<double>& val = graphs ? graph_val : eager_val;
        std::vector<double>& ls = graphs ? graph_losses : eager_losses;
        while (t.step() < 6) {
            ls.push_back(t.train_step().loss);
            if (t.step() % 2 == 0) val.push_back(t.evaluate());
        }
        if (graphs) captures = t.model().graph_captures();
    }
    EXPECT_EQ(eager_losses, graph_losses);
    EXPECT_EQ(eager_val, graph_val);
    EXPECT_EQ(captures, 3) << "captured after the first step and after each of the two evaluations before the end";
}
