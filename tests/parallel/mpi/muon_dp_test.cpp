// optim.name = "muon" under data (and expert) parallelism (muon.md §9 test 4). Replicated (parallel.zero_stage = 0):
// every rank keeps every matrix's momentum and runs its Newton-Schulz on the all-reduced gradient. Whole-matrix
// ownership (zero_stage = 1, the default): each matrix is owned by one rank of its group, which receives its reduced
// gradient by the packed reduce-scatter, updates it, and all-gathers it back. Either way the losses, gradient norms
// and the parameters after 10 steps equal one process's (loss and norm within 1e-5, parameters rho <= 1e-6): dp = n,
// and on four ranks dp = 2 x ep = 2 with MoE; under ownership also with small buckets (several per step) and with
// the owners capped at one (muon.max_owner_group, the others computing copies). Every matrix is owned exactly once
// over the job, and every rank derives the same assignment.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "nn/param_table.h"
#include "parallel/mpi/layout_match.h"

using namespace mt::testing;

namespace {

std::vector<std::string> muon_keys(const Layout& l, int zero_stage) {
    std::vector<std::string> keys = {
        "optim.name=\"muon\"", "parallel.zero_stage=" + std::to_string(zero_stage), "train.lr=5e-3"};
    if (l.ep > 1)
        keys.insert(keys.end(), {"moe.enabled=true", "moe.num_experts=4", "moe.top_k=2", "moe.expert_ffn_dim=16"});
    return keys;
}

// "name#global matrix index" of the matrices this rank writes (owns, not as a capped copy), one per line.
std::string owned_matrices(const mt::train::Trainer& trainer) {
    const mt::nn::ParamTable& table = const_cast<mt::train::Trainer&>(trainer).model().params();
    std::string out;
    for (const auto& e : trainer.muon()->entries()) {
        const mt::nn::ParamSpec& spec = table.spec(e.param);
        const int64_t first = spec.shape.size() == 3 ? mt::nn::param_box(spec).offset[0] : 0;
        for (size_t k = 0; k < e.matrices.size(); ++k)
            if (e.writer[k]) out += fmt::format("{}#{}\n", spec.name, first + e.matrices[k]);
    }
    return out;
}

}  // namespace

TEST(TrainerMuon, DataParallelEqualsOneProcess) {
    const int n = dist_world().size();
    std::vector<Layout> layouts = {{.dp = n}};
    if (n == 4) layouts.push_back({.dp = 2, .ep = 2});
    for (const Layout& l : layouts) expect_layout_matches(layout_name("muon", l), l, muon_keys(l, 0), 10, 1e-6);
}

TEST(TrainerMuon, WholeMatrixOwnershipEqualsOneProcess) {
    const int n = dist_world().size();
    std::vector<Layout> layouts = {{.dp = n}};
    if (n == 4) layouts.push_back({.dp = 2, .ep = 2});
    for (const Layout& l : layouts) {
        expect_layout_matches(layout_name("muon_owned", l), l, muon_keys(l, 1), 10, 1e-6);
        std::vector<std::string> small = muon_keys(l, 1);  // a bucket per few matrices: several reduce-scatters
        small.insert(small.end(), {"muon.bucket_mb=0.001", "parallel.bucket_mb=0.001"});
        expect_layout_matches(layout_name("muon_owned_small", l), l, small, 10, 1e-6);
    }
    // QK-clip at a tau far below the logits: every owner scales the rows of its query and key matrices.
    std::vector<std::string> clipped = muon_keys({.dp = n}, 1);
    clipped.push_back("optim.qk_clip_tau=0.01");
    expect_layout_matches(layout_name("muon_owned_qk_clip", {.dp = n}), {.dp = n}, clipped, 10, 1e-6);
    std::vector<std::string> capped = muon_keys({.dp = n}, 1);
    capped.push_back("muon.max_owner_group=1");
    expect_layout_matches(layout_name("muon_owned_capped", {.dp = n}), {.dp = n}, capped, 10, 1e-6);
}

// The overlap of muon.md §3: with a bucket per few matrices, the owners step each bucket's matrices inside the
// reduction's wait, as it lands (optim/muon_overlapped_batches), and the run still equals one process (above).
TEST(TrainerMuon, OwnerStepRunsAsEachBucketLands) {
    const int n = dist_world().size();
    std::vector<std::string> keys = muon_keys({.dp = n}, 1);
    keys.insert(keys.end(), {"muon.bucket_mb=0.001", "parallel.bucket_mb=0.001", "parallel.dp=" + std::to_string(n)});
    mt::train::Trainer t(mpi_job(data_dir(), shared_dir("muon_overlap"), keys), false);
    ASSERT_GE(t.gradient_buckets(), 2);  // at 8 ranks the 2 R matrices rule leaves one Muon bucket beside the others
    for (int step = 0; step < 2; ++step) {
        const mt::train::StepResult r = t.train_step();
        // Every batch was staged inside the wait (each belongs to one bucket), none stepped after it.
        EXPECT_GT(r.optim.muon_overlapped_batches, 0) << "step " << step;
        EXPECT_EQ(r.optim.muon_overlapped_batches, static_cast<int64_t>(t.muon()->batches().size())) << "step " << step;
    }
    // The own-norm clip needs the whole Muon group's norm first: no overlap.
    keys.push_back("muon.clip=\"own_norm\"");
    mt::train::Trainer clipped(mpi_job(data_dir(), shared_dir("muon_overlap_clip"), keys), false);
    EXPECT_EQ(clipped.train_step().optim.muon_overlapped_batches, 0);
}

// The compressed reduce-to-owner hands each owner the sum the uncompressed reduce-scatter gives: after one step
// compressed from the start (several ranges per block: small buckets), the AdamW part (raw f32) has the uncompressed
// run's group norm, and at level 1 (unbiased bf16 rounding) the Muon part's within 1e-3. (Every range of a block
// but the first once received the wrong elements: the norm fell by about 1/sqrt(2).)
TEST(TrainerMuon, CompressedReduceSumsWhatTheUncompressedOneSums) {
    const int n = dist_world().size();
    std::vector<std::string> keys = muon_keys({.dp = n}, 1);
    keys.insert(keys.end(), {"muon.bucket_mb=0.001", "parallel.bucket_mb=0.001", "compress.warmup_steps=0"});
    mt::train::Trainer plain(mpi_job(data_dir(), shared_dir("muon_cr_plain"), keys), false);
    const mt::train::StepResult want = plain.train_step();
    ASSERT_GT(want.optim.muon_grad_norm, 0.0);
    for (int level : {1, 2, 3}) {
        std::vector<std::string> c = keys;
        c.push_back("compress.level=" + std::to_string(level));
        mt::train::Trainer t(mpi_job(data_dir(), shared_dir("muon_cr_" + std::to_string(level)), c), false);
        const mt::train::StepResult got = t.train_step();
        EXPECT_NEAR(got.optim.adamw_grad_norm, want.optim.adamw_grad_norm, 1e-6 * want.optim.adamw_grad_norm)
            << "level " << level;
        if (level == 1) {
            EXPECT_NEAR(got.optim.muon_grad_norm, want.optim.muon_grad_norm, 1e-3 * want.optim.muon_grad_norm);
        }
    }
}

TEST(TrainerMuon, EveryMatrixIsOwnedExactlyOnce) {
    const int n = dist_world().size();
    std::vector<Layout> layouts = {{.dp = n}};
    if (n == 4) layouts.push_back({.dp = 2, .ep = 2});
    for (const Layout& l : layouts) {
        for (const char* cap : {"0", "1"}) {
            std::vector<std::string> keys = muon_keys(l, 1);
            keys.insert(keys.end(),
                        {"muon.bucket_mb=0.001",
                         "parallel.bucket_mb=0.001",
                         std::string("muon.max_owner_group=") + cap,
                         "parallel.dp=" + std::to_string(l.dp),
                         "parallel.ep=" + std::to_string(l.ep),
                         "train.steps=1"});
            const std::string name = layout_name("muon_once", l) + "_cap" + cap;
            mt::train::Trainer trainer(mpi_job(data_dir(), shared_dir(name), keys), false);
            const std::vector<std::string> all =
                mt::parallel::comm_gather_strings(dist_world(), owned_matrices(trainer));
            // The one-process optimizer holds every matrix: the union over the ranks must be exactly its list.
            auto self = comm_make_self();
            std::vector<std::string> one_keys = muon_keys(l, 1);
            one_keys.push_back("train.steps=1");
            mt::train::Trainer single(mpi_job(data_dir(), shared_dir(name) + "/single", one_keys), false, self.get());
            if (dist_world().rank() != 0) continue;
            std::map<std::string, int> owners;
            for (const std::string& rank_list : all) {
                size_t at = 0;
                for (size_t nl; (nl = rank_list.find('\n', at)) != std::string::npos; at = nl + 1)
                    ++owners[rank_list.substr(at, nl - at)];
            }
            const std::string every = owned_matrices(single);
            int64_t matrices = 0;
            size_t at = 0;
            for (size_t nl; (nl = every.find('\n', at)) != std::string::npos; at = nl + 1, ++matrices)
                EXPECT_EQ(owners[every.substr(at, nl - at)], 1) << name << ": " << every.substr(at, nl - at);
            EXPECT_EQ(static_cast<int64_t>(owners.size()), matrices) << name;
            EXPECT_GT(matrices, 0) << name;
            // Each rank owns its share: none holds every matrix (the capped owner: every dense one).
            for (size_t r = 0; r < all.size(); ++r) {
                const auto mine = static_cast<int64_t>(std::count(all[r].begin(), all[r].end(), '\n'));
                if (std::string(cap) != "0") continue;
                EXPECT_LT(mine, matrices) << name << " rank " << r;
                EXPECT_GT(mine, 0) << name << " rank " << r;
            }
        }
    }
}

TEST(TrainerMuon, OwnedStateResumesExactlyAndOnAnotherDataParallelSize) {
    // The momentum of each matrix is written by its owner at its place in the parameter's global tensor, so a resume
    // on the same ranks is bitwise and one process (which owns everything) reads the same checkpoint.
    const int n = dist_world().size();
    const std::string dir = shared_dir("muon_owned_resume");
    std::vector<std::string> keys = muon_keys({.dp = n}, 1);
    keys.insert(keys.end(),
                {"muon.bucket_mb=0.001", "parallel.bucket_mb=0.001", "train.grad_accum=2", "train.steps=8"});
    ResumeRun run;
    ASSERT_NO_FATAL_FAILURE(expect_exact_resume(mpi_job(data_dir(), dir, keys), &run));
    auto self = comm_make_self();
    std::vector<std::string> one = muon_keys({.dp = 1}, 1);
    one.insert(one.end(), {"train.grad_accum=" + std::to_string(2 * n), "train.steps=8", "parallel.dp=1"});
    mt::train::Trainer single(mpi_job(data_dir(), dir + "/one", one), false, self.get());
    single.load_checkpoint(run.checkpoint);
    for (int step = 5; step <= 8; ++step) {
        const double loss = single.train_step().loss, want = run.losses[size_t(step - 1)];
        EXPECT_LT(std::abs(loss - want) / want, 1e-5) << "step " << step << ": " << loss << " vs " << want;
    }
}

// Gradient compression on the reduce-to-owner leg (muon.md §6 and §9 tests 8 and 9), levels 1 to 3 after a two-step
// warm-up: 20 steps twice give bitwise equal losses and parameters (and so does the uncompressed run); a checkpoint
// after step 4 (compressing since step 3, the error buffers in it) resumes bitwise; level 1 (unbiased bf16 rounding)
// follows the uncompressed run closely; the wire bytes of the compressed leg are below the uncompressed ones (level 2:
// about 1/32 on the matrices).
TEST(TrainerMuon, CompressedReduceIsDeterministicAndResumesBitwise) {
    const int n = dist_world().size();
    std::vector<std::string> base = muon_keys({.dp = n}, 1);
    base.insert(base.end(),
                {"muon.bucket_mb=0.001", "parallel.bucket_mb=0.001", "compress.warmup_steps=2", "compress.chunk=64"});
    struct Run {
        std::vector<double> first;  // the losses
        mt::train::OptimStepMetrics second;
        std::vector<double> params;  // every master weight after the last step
    };
    auto run = [&](const std::string& name, int level, int steps) {
        std::vector<std::string> keys = base;
        keys.push_back("compress.level=" + std::to_string(level));
        keys.push_back("train.steps=" + std::to_string(steps));
        mt::train::Trainer t(mpi_job(data_dir(), shared_dir(name), keys), false);
        Run out;
        for (int s = 0; s < steps; ++s) {
            const auto r = t.train_step();
            out.first.push_back(r.loss);
            out.second = r.optim;
        }
        const mt::nn::ParamTable& table = t.model().params();
        for (int i = 0; i < table.size(); ++i)
            for (int64_t k = 0; k < table.master(i).numel(); ++k)
                out.params.push_back(mt::core::tensor_get_flat(table.master(i), k));
        return out;
    };
    // muon.md §9 test 9: 20 steps twice, bitwise equal parameters, without and with compression.
    const Run plain = run("compress_off", 0, 20), again = run("compress_off_again", 0, 20);
    EXPECT_EQ(plain.params, again.params) << "uncompressed";
    for (int level = 1; level <= 3; ++level) {
        const std::string name = "compress_l" + std::to_string(level);
        const Run a = run(name + "_a", level, 20), b = run(name + "_b", level, 20);
        EXPECT_EQ(a.first, b.first) << name;
        EXPECT_EQ(a.params, b.params) << name;
        EXPECT_NE(a.first[5], plain.first[5]) << name << ": compression changed nothing";
        EXPECT_EQ(a.first[1], plain.first[1]) << name << ": the warm-up is uncompressed";
        EXPECT_GT(a.second.compress_wire_bytes, 0) << name;
        EXPECT_LT(a.second.compress_wire_bytes, a.second.compress_raw_bytes) << name;
        EXPECT_GT(a.second.compress_error, 0.0) << name;
        if (level == 1) {
            EXPECT_LT(std::abs(a.first.back() - plain.first.back()) / plain.first.back(), 1e-2);
        }
        if (level == 2) {
            EXPECT_GT(a.second.compress_ef_ratio, 0.0);
        }
        std::vector<std::string> keys = base;
        keys.push_back("compress.level=" + std::to_string(level));
        keys.push_back("checkpoint.keep_last=5");
        ResumeRun resume;
        ASSERT_NO_FATAL_FAILURE(expect_exact_resume(mpi_job(data_dir(), shared_dir(name + "_resume"), keys), &resume));
        if (dist_world().rank() == 0)
            fmt::print(
                "compress.level {}: loss after 20 steps {:.5f} (uncompressed {:.5f}), wire {} of {} bytes, "
                "error {:.3f}, ef ratio {:.3f}\n",
                level,
                a.first.back(),
                plain.first.back(),
                a.second.compress_wire_bytes,
                a.second.compress_raw_bytes,
                a.second.compress_error,
                a.second.compress_ef_ratio);
    }
}

// muon.md §9 test 5, overlap safety: with parallel.poison_gathers every element a rank does not own is NaN from the
// optimizer step until its bucket's gather lands, so a forward that read a parameter before waiting for its bucket
// would produce a NaN loss. Ten steps of Muon's packed buckets and AdamW's plain ones (several buckets per step)
// must equal the unpoisoned run bitwise, with the evaluation and a checkpoint in between reading the weights too.
TEST(TrainerMuon, PoisonedGathersAreNeverRead) {
    const int n = dist_world().size();
    for (const char* optim : {"muon", "adamw"}) {
        auto run = [&](bool poison) {
            std::vector<std::string> keys = muon_keys({.dp = n}, 1);
            keys[0] = std::string("optim.name=\"") + optim + "\"";
            keys.insert(keys.end(),
                        {"muon.bucket_mb=0.001",
                         "parallel.bucket_mb=0.001",
                         std::string("parallel.poison_gathers=") + (poison ? "true" : "false")});
            const std::string name = std::string("poison_") + optim + (poison ? "_on" : "_off");
            mt::train::Trainer t(mpi_job(data_dir(), shared_dir(name), keys), false);
            std::vector<double> out;
            for (int s = 0; s < 10; ++s) {
                out.push_back(t.train_step().loss);
                if (s == 4) {
                    out.push_back(t.evaluate());
                    t.save_checkpoint();
                }
            }
            return out;
        };
        const std::vector<double> clean = run(false), poisoned = run(true);
        EXPECT_EQ(poisoned, clean) << optim;
        for (double l : poisoned) EXPECT_TRUE(std::isfinite(l)) << optim;
    }
}
