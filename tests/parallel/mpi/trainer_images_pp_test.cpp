// Image + text training under pipeline parallelism (issue 30 item 8, docs/distributed.md "Pipeline parallelism"): the
// vision tower lives on the first stage (the rank holding the embedding), which encodes each micro-batch's images in
// its forwards (the schedule's re-runs included) and sends the image slots' gradient into the projector and the ViT.
// The shapes job (a 4-layer LM, tied embeddings; untied with MoE layers balanced per modality too) under pp = n with
// 1F1B, on two ranks also interleaved (2 virtual stages), on four ranks also pp = 2 x dp = 2 with 1F1B (ZeRO-1, a
// bucket per parameter, poisoned gathers) and interleaved, follows the one-process run with the same global batch:
// loss, gradient norm, final parameters and val loss within 1e-5 (relative, f32), as the other pipeline tests
// (layout_match.h). The per-group gradient norms of the vision encoder and the projector, the splice's statistics
// (vision/*) and the shapes eval's bound and exact match equal one process's; the other stages hold no vision
// parameter; and checkpoints move between pp = n and one process both ways.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/layer_stats.h"
#include "parallel/mpi/layout_match.h"
#include "parallel/mpi/mpi_job.h"

using mt::testing::expect_layout_matches;
using mt::testing::Layout;
using mt::testing::layout_name;
using mt::testing::mpi_shapes_job;
using mt::testing::shared_dir;
using mt::train::Trainer;
using namespace mt::parallel;

namespace {

// 4 layers (pp = 2 x 2 virtual stages has a layer per chunk), 112-pixel canvases (64 patches, 16 image tokens per
// image) in rows of 64 tokens that hold two samples each, two rows per micro-batch: four images per micro-batch.
std::vector<std::string> shapes_model(std::vector<std::string> extra = {}) {
    std::vector<std::string> keys = {
        "model.n_layers=4", "data.shapes.max_canvas=112", "train.seq_len=64", "train.batch_size=2"};
    keys.insert(keys.end(), extra.begin(), extra.end());
    return keys;
}

double relative(double a, double b) {
    return std::abs(a - b) / std::max(std::abs(a), 1e-30);
}

}  // namespace

TEST(TrainerImagesPp, ShapesMatchOneProcessForEveryLayout) {
    const int n = dist_world().size();
    std::vector<std::pair<Layout, std::vector<std::string>>> layouts = {{{.pp = n}, {}}};
    if (n == 2) layouts.push_back({{.pp = 2, .virtual_stages = 2}, {}});
    if (n == 4) {
        // ZeRO-1 over the stages' data ranks, each parameter a bucket of its own (the tower's buckets apart from the
        // embedding's) and the unowned elements NaN until their gather lands.
        const std::vector<std::string> zero = {"parallel.bucket_mb=0.0001", "parallel.poison_gathers=true"};
        layouts.push_back({{.dp = 2, .pp = 2}, zero});
        layouts.push_back({{.dp = 2, .pp = 2, .virtual_stages = 2}, {}});  // pp = 4 x 2 would outnumber the layers
    }
    for (const auto& [l, extra] : layouts)
        expect_layout_matches(layout_name("shapes", l), l, shapes_model(extra), 6, 0.0, mpi_shapes_job);
    // Untied embeddings (the last stage's head a weight of its own) and MoE layers with a balancer per modality: every
    // stage learns its rows' modalities from the ids, and its QB state equals one process's.
    const Layout plain{.pp = n};
    expect_layout_matches(layout_name("shapes_untied_moe", plain),
                          plain,
                          shapes_model({"model.tie_embeddings=false",
                                        "moe.enabled=true",
                                        "moe.first_k_dense=1",
                                        "moe.num_experts=4",
                                        "moe.top_k=2",
                                        "moe.expert_ffn_dim=16",
                                        "moe.modality_bias=\"balanced\"",
                                        "moe.quantile.update_interval=2"}),
                          4,
                          0.0,
                          mpi_shapes_job);
}

// A metrics step under pp = n (1F1B, two micro-batches: the first stage re-runs micro-batch 0's forward before its
// backward) against one process: the layer statistics (the splice's image share and RMS counted once per micro-batch,
// not again by the re-run) and every group's gradient norm, the vision encoder's and the projector's included; the
// shapes eval's bound and exact match. Only the first stage holds the tower.
TEST(TrainerImagesPp, VisionMetricsAndEvalMatchOneProcess) {
    const int n = dist_world().size(), rank = dist_world().rank();
    const std::string dir = shared_dir("shapes_pp_metrics");
    const std::vector<std::string> keys = shapes_model({"metrics.layer_stats=true", "metrics.every=1"});
    auto with = [&](std::vector<std::string> more) {
        more.insert(more.begin(), keys.begin(), keys.end());
        return more;
    };
    auto self = comm_make_self();
    Trainer one(mpi_shapes_job(fmt::format("{}/one_r{}", dir, rank), with({"train.grad_accum=2", "parallel.dp=1"})),
                false,
                self.get());
    Trainer pp(mpi_shapes_job(dir + "/pp", with({"train.grad_accum=2", "parallel.pp=" + std::to_string(n)})), false);
    // The tower is the first stage's: no other stage declares a vision or projector parameter.
    const bool first = pp.model().chunk_has_embedding(0);
    EXPECT_EQ(pp.model().vision() != nullptr, first) << "rank " << rank;
    auto tower_params = [](const mt::nn::ParamTable& table) {
        int count = 0;
        for (int i = 0; i < table.size(); ++i)
            count += table.spec(i).name.starts_with("vision.") || table.spec(i).name.starts_with("projector.") ? 1 : 0;
        return count;
    };
    const int vision_params = tower_params(pp.model().params()), expected = tower_params(one.model().params());
    EXPECT_GT(expected, 0);
    EXPECT_EQ(vision_params, first ? expected : 0) << "rank " << rank;
    const int64_t splice = mt::nn::layer_stats_layout(one.model().config()).splice();
    ASSERT_GE(splice, 0);
    for (int step = 1; step <= 3; ++step) {
        const auto a = one.train_step();
        const auto b = pp.train_step();
        EXPECT_LT(relative(a.loss, b.loss), 1e-5) << "step " << step;
        ASSERT_EQ(a.layer_stats.size(), b.layer_stats.size());
        ASSERT_GT(a.layer_stats[static_cast<size_t>(splice)], 0.0) << "no image rows counted";
        // The image rows and all rows are counts: equal; the sums within f32 summation order.
        EXPECT_EQ(a.layer_stats[static_cast<size_t>(splice)], b.layer_stats[static_cast<size_t>(splice)]);
        for (size_t k = 0; k < a.layer_stats.size(); ++k)
            EXPECT_LT(std::abs(a.layer_stats[k] - b.layer_stats[k]), 1e-5 * std::max(1.0, std::abs(a.layer_stats[k])))
                << "step " << step << " stat slot " << k << ": " << a.layer_stats[k] << " vs " << b.layer_stats[k];
        // Groups: the layers, then the vision encoder and the projector.
        ASSERT_EQ(a.layer_grad_sq.size(), static_cast<size_t>(one.model().config().n_layers + 2));
        ASSERT_EQ(a.layer_grad_sq.size(), b.layer_grad_sq.size());
        for (size_t g = 0; g < a.layer_grad_sq.size(); ++g) {
            EXPECT_GT(a.layer_grad_sq[g], 0.0) << "group " << g;
            EXPECT_LT(relative(a.layer_grad_sq[g], b.layer_grad_sq[g]), 1e-5) << "step " << step << " group " << g;
        }
    }
    const double va = one.evaluate(), vb = pp.evaluate();
    EXPECT_LT(relative(va, vb), 1e-5) << "val loss " << va << " vs " << vb;
    EXPECT_DOUBLE_EQ(one.last_eval_bound(), pp.last_eval_bound());
    // Scored on the last stage, summed over the stages: every rank reports the one-process counts.
    EXPECT_EQ(one.last_shapes_eval().score.samples, pp.last_shapes_eval().score.samples);
    EXPECT_GT(pp.last_shapes_eval().score.samples, 0);
    EXPECT_EQ(one.last_shapes_eval().score.exact, pp.last_shapes_eval().score.exact);
    const auto controls_one = one.last_shapes_controls(), controls_pp = pp.last_shapes_controls();
    ASSERT_EQ(controls_one.size(), controls_pp.size());
    for (size_t c = 0; c < controls_one.size(); ++c) {
        EXPECT_EQ(controls_one[c].second.score.samples, controls_pp[c].second.score.samples);
        EXPECT_EQ(controls_one[c].second.score.exact, controls_pp[c].second.score.exact);
    }
}

// The tower's parameters and their AdamW state are the first stage's in a checkpoint: saved under pp = n, resumed by
// one process; saved by one process, resumed under pp = n. The next 3 losses equal the uninterrupted run's.
TEST(TrainerImagesPp, CheckpointsMoveBetweenPipelineAndOneProcess) {
    const int n = dist_world().size(), rank = dist_world().rank();
    const std::string dir = shared_dir("shapes_pp_ckpt");
    auto job = [&](const std::string& run, std::vector<std::string> layout) {
        std::vector<std::string> keys = shapes_model({"train.steps=6", "train.grad_accum=2"});
        keys.insert(keys.end(), layout.begin(), layout.end());
        return mpi_shapes_job(run, keys);
    };
    const std::string pipeline = "parallel.pp=" + std::to_string(n);
    auto self = comm_make_self();
    const std::string one_dir = fmt::format("{}/one_r{}", dir, rank);
    std::vector<double> pp_losses, one_losses;
    {
        Trainer pp(job(dir + "/pp", {pipeline}), false);
        Trainer one(job(one_dir, {"parallel.dp=1"}), false, self.get());
        for (int step = 1; step <= 6; ++step) {
            pp_losses.push_back(pp.train_step().loss);
            one_losses.push_back(one.train_step().loss);
            if (step != 3) continue;
            pp.save_checkpoint();
            one.save_checkpoint();
        }
    }
    Trainer to_one(job(fmt::format("{}/to_one_r{}", dir, rank), {"parallel.dp=1"}), false, self.get());
    to_one.load_checkpoint(dir + "/pp/checkpoints/step_00000003");
    Trainer to_pp(job(dir + "/to_pp", {pipeline}), false);
    to_pp.load_checkpoint(one_dir + "/checkpoints/step_00000003");
    for (int step = 4; step <= 6; ++step) {
        const double a = to_one.train_step().loss, b = to_pp.train_step().loss;
        const auto i = static_cast<size_t>(step - 1);
        EXPECT_LT(relative(pp_losses[i], a), 1e-5) << "pp -> one process, step " << step;
        EXPECT_LT(relative(one_losses[i], b), 1e-5) << "one process -> pp, step " << step;
    }
}
