// Communication accounting under mpirun (parallel.md §6 and §9.5, docs/distributed.md "Communication accounting"):
// the bytes and calls one training step puts on each report group equal what the code moves, written below as
// formulas in the block count L, the hidden size d, the micro-batch's b rows of s tokens, the micro-batches per step
// A and the bytes per element e; the same figures reach metrics.jsonl's train lines; one process reports zeros.
// Layouts: tp = n without and with sequence parallelism, dp = n with ZeRO-1 and with a replicated optimizer, on
// four ranks tp = 2 x dp = 2, and pp = n (1F1B and interleaved) with and without Block AttnRes.
#include <gtest/gtest.h>

#include <array>
#include <fstream>
#include <map>
#include <numeric>
#include <string>

#include "nn/layer_stats.h"
#include "nn/layers/attnres.h"
#include "parallel/mpi/mpi_job.h"
#include "parallel/runtime.h"
#include "train/trainer.h"

using mt::train::CommTraffic;
using mt::train::Trainer;
using namespace mt::parallel;
using mt::testing::data_dir;
using mt::testing::shared_dir;

namespace {

// tiny_job's model (L = 2 blocks, d = 32) with 4 key/value heads so that tp = 4 divides them; micro-batches of
// b = 2 rows of s = 16 tokens, A = 2 per step; f32 on the CPU, so activations, gradients and weights all have e = 4.
constexpr int64_t kLayers = 2, kDim = 32, kBatch = 2, kSeq = 16, kAccum = 2, kElem = 4;
constexpr std::array<const char*, 6> kGroups = {"tp", "cp", "ep", "dp", "pp", "world"};

using Traffic = std::map<std::string, CommTraffic>;
struct Count {
    int64_t bytes = 0, calls = 0;
};
using Expected = std::map<std::string, Count>;  // a group not named: zero

// Tensor parallelism over t ranks, per step. Per micro-batch of N = b s token rows, every block has two regions with
// a collective at each edge, forward and backward (block.cpp region_input / region_output / region_backward), and
// the vocab-parallel embedding and head add two more (the lookup's sum over tp in the forward, the head's input
// gradient's in the backward): 4L + 2 sums of N d e bytes. Without sequence parallelism each is an all-reduce.
// With it each is a reduce-scatter (counted as its whole input, N d e) paired with an all-gather of the rank's N / t
// rows (counted as its own block, N d e / t): the regions' entries, the final norm's rows before the head and the
// output gradient's rows before the embedding's backward. The loss adds two collectives of one f64 per row on the
// host (combine_vocab_shards: the all-gather of each shard's log-sum-exp and the all-reduce of the target logits).
Count tp_step(int64_t t, bool sp) {
    const int64_t n = kBatch * kSeq, sums = 4 * kLayers + 2, rows = n * kDim * kElem, loss = 2 * n * 8;
    // Per step, QK-clip's count of clipped heads: one f64 sum over the tp ranks (each counts its own heads).
    const Count qk_count = {8, 1};
    if (!sp) return {kAccum * (sums * rows + loss) + qk_count.bytes, kAccum * (sums + 2) + qk_count.calls};
    return {kAccum * (sums * rows + sums * rows / t + loss) + qk_count.bytes, kAccum * (2 * sums + 2) + qk_count.calls};
}

// The data-parallel groups, per step, once for the whole step (the gradients are reduced after the last
// micro-batch's backward). Over dp_span (D ranks): the dense gradients, P_dense elements (the arena, each parameter
// padded to the alignment), in B_dense buckets; over stage (t D ranks): the tp-partial ones, the norm gains under
// sequence parallelism, P_stage = (2L + 1) d (each padded) in L + 1 buckets (each block's two gains are neighbours in
// the arena, the final norm is alone). ZeRO-1 (D > 1) reduce-scatters each bucket (its whole input) and all-gathers the
// updated weights (the rank's slice, 1 / |group| of it); a replicated optimizer all-reduces each bucket; a group of
// one rank moves nothing. Over dp_span, D > 1: three f64 sums (the global batch's supervised tokens, the loss, the
// aux loss).
Count dp_step(int64_t tp, int64_t dp, bool zero, int64_t p_dense, int64_t p_stage, int64_t buckets, int64_t qk_heads) {
    const int64_t stage = tp * dp, stage_buckets = p_stage > 0 ? kLayers + 1 : 0;
    Count c;
    auto group = [&](int64_t elems, int64_t n_buckets, int64_t ranks) {
        if (ranks == 1) return;
        const bool sharded = zero && dp > 1;  // ZeRO-1 needs more than one data rank (GradSync::zero)
        c.bytes += elems * kElem + (sharded ? elems * kElem / ranks : 0);
        c.calls += n_buckets * (sharded ? 2 : 1);
    };
    group(p_dense, buckets - stage_buckets, dp);
    group(p_stage, stage_buckets, stage);
    if (dp > 1) c.bytes += 3 * 8, c.calls += 3;
    // QK-clip (optim.qk_clip, on by default): one MAX all-reduce of every attention layer's per-head maxima (f64, this
    // rank's heads: 1 / tp of them) over the data-parallel ranks.
    if (dp > 1) c.bytes += qk_heads / tp * 8, c.calls += 1;
    return c;
}

// World, every step of a multi-process run: the gradient norm with the per-layer gradient norms of metrics.layer_stats
// (one all-reduce of 1 + one f64 per layer: GradSync::grad_norms), the memory figures' maxima (five f64) and, on the
// steps that write a train line (every step here), one all-reduce of the per-layer update and weight norms (AdamW's
// sums: no QK-clip rescaled a head in these steps) with the device statistics' slots (nn/layer_stats.h:
// Trainer::layer_stats_end).
Count world_step(const mt::train::JobConfig& cfg) {
    const int64_t layers = cfg.model.n_layers, slots = mt::nn::layer_stats_layout(cfg.model).size;
    return {(6 + 3 * layers + slots) * 8, 3};
}

Traffic minus(const Traffic& a, const Traffic& b) {
    Traffic d;
    for (const auto& [name, t] : a) {
        const CommTraffic& u = b.at(name);
        d[name] = {.bytes = t.bytes - u.bytes, .calls = t.calls - u.calls, .seconds = t.seconds - u.seconds};
    }
    return d;
}

void expect_counts(const std::string& what,
                   const std::string& group,
                   const Count& want,
                   int64_t bytes,
                   int64_t calls,
                   double seconds) {
    EXPECT_EQ(bytes, want.bytes) << what << " comm/" << group << "/bytes";
    EXPECT_EQ(calls, want.calls) << what << " comm/" << group << "/calls";
    // Host time inside the calls and waits: some wherever there were calls, none where there were not.
    if (want.calls > 0)
        EXPECT_GT(seconds, 0.0) << what << " comm/" << group << "/seconds";
    else
        EXPECT_EQ(seconds, 0.0) << what << " comm/" << group << "/seconds";
}

void expect_traffic(const std::string& what, const Traffic& got, const Expected& want) {
    for (const char* g : kGroups) {
        const auto w = want.find(g);
        const CommTraffic& t = got.at(g);
        expect_counts(what, g, w != want.end() ? w->second : Count{}, t.bytes, t.calls, t.seconds);
    }
}

// The train lines of a run's metrics.jsonl, checked against `want` (on world rank 0, the writer).
void expect_metrics(const std::string& what, const std::string& path, const Expected& want, int64_t steps) {
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    int64_t lines = 0;
    for (std::string line; std::getline(in, line);) {
        const nlohmann::json j = nlohmann::json::parse(line);
        if (j.at("kind") != "train") continue;
        ++lines;
        for (const char* g : kGroups) {
            const std::string key = std::string("comm/") + g;
            const auto w = want.find(g);
            expect_counts(fmt::format("{} metrics step {}", what, j.at("step").get<int64_t>()),
                          g,
                          w != want.end() ? w->second : Count{},
                          j.at(key + "/bytes").get<int64_t>(),
                          j.at(key + "/calls").get<int64_t>(),
                          j.at(key + "/seconds").get<double>());
        }
    }
    EXPECT_EQ(lines, steps) << path;
}

struct Layout {
    int64_t tp, dp;
    bool sp, zero;
};

std::string layout_name(const Layout& l) {
    return fmt::format("tp{}_dp{}_{}_zero{}", l.tp, l.dp, l.sp ? "sp" : "nosp", l.zero ? 1 : 0);
}

// Two steps of the layout called directly (every rank checks its own traffic per step), then two through run()
// (rank 0 checks its metrics.jsonl lines).
void expect_layout_matches_formula(const Layout& l) {
    const std::string name = layout_name(l), dir = shared_dir(name), data = data_dir();
    auto config = [&](const std::string& run) {
        return mt::testing::mpi_job(data,
                                    run,
                                    {"model.n_kv_heads=4",
                                     "train.steps=2",
                                     "train.grad_accum=" + std::to_string(kAccum),
                                     "parallel.tp=" + std::to_string(l.tp),
                                     "parallel.dp=" + std::to_string(l.dp),
                                     std::string("parallel.sequence_parallel=") + (l.sp ? "true" : "false"),
                                     std::string("parallel.zero_stage=") + (l.zero ? "1" : "0")});
    };
    Trainer t(config(dir + "/steps"), false);
    // The arena's elements by reduction group (Trainer::model() settles nothing yet: no step has run).
    const mt::nn::ParamTable& table = t.model().params();
    int64_t p_dense = 0, p_stage = 0;
    for (int i = 0; i < table.size(); ++i) (table.spec(i).tp_partial_grad ? p_stage : p_dense) += table.padded_numel(i);
    // The norm gains are tp-partial exactly under sequence parallelism. Each parameter is padded to the arena's
    // alignment, lcm(64, |dp_span|, |edp|, |stage|) elements (ParamTable::layout), and the buckets move the padding.
    const int64_t align = std::lcm(int64_t{64}, l.tp * l.dp), gain = (kDim + align - 1) / align * align;
    ASSERT_EQ(p_stage, l.tp > 1 && l.sp ? (2 * kLayers + 1) * gain : 0);
    int64_t qk_heads = 0;  // the attention layers' query heads (QK-clip's maxima)
    for (int64_t layer = 0; layer < t.config().model.n_layers; ++layer)
        if (!t.config().model.layer_is_kda(layer)) qk_heads += t.config().model.n_heads;
    Expected want = {{"dp", dp_step(l.tp, l.dp, l.zero, p_dense, p_stage, t.gradient_buckets(), qk_heads)},
                     {"world", world_step(t.config())}};
    if (l.tp > 1) want["tp"] = tp_step(l.tp, l.sp);
    for (int step = 1; step <= 2; ++step) {
        const Traffic before = t.comm_traffic();
        (void)t.train_step();
        const Traffic got = minus(t.comm_traffic(), before);
        expect_traffic(fmt::format("{} step {} rank {}", name, step, dist_world().rank()), got, want);
        if (dist_world().rank() == 0 && step == 2)
            fmt::print(
                "{}: tp {} bytes in {} calls ({:.2e} s), dp {} bytes in {} calls ({:.2e} s), world {} bytes in "
                "{} calls; formulas: tp {} / {}, dp {} / {} (P_dense {}, P_stage {}, {} buckets)\n",
                name,
                got.at("tp").bytes,
                got.at("tp").calls,
                got.at("tp").seconds,
                got.at("dp").bytes,
                got.at("dp").calls,
                got.at("dp").seconds,
                got.at("world").bytes,
                got.at("world").calls,
                want["tp"].bytes,
                want["tp"].calls,
                want["dp"].bytes,
                want["dp"].calls,
                p_dense,
                p_stage,
                t.gradient_buckets());
    }
    Trainer run(config(dir + "/run"), false);
    run.run();
    if (dist_world().rank() == 0) expect_metrics(name, dir + "/run/metrics.jsonl", want, 2);
    dist_world().barrier();
}

// Pipeline parallelism over n stages with v chunks each, per step on stage s: for each of the A micro-batches,
// each of its chunks g sends its output on (g not the last chunk) and its input's gradient back (g not the first),
// N d e bytes each, and receives the same. Under Block AttnRes a hop carries the sources attnres_hop_sources names
// (the embedding, the block sums the receiver lacks, a cut block's running partial sum), N d e bytes each, and its
// backward their gradients. One all-gather of four f64 per rank (its wait and compute seconds, its aux loss and
// loss, summed over the pipeline from the gather) and one of its peak memory (an f64): 40 bytes in two calls.
// per_hop[g]: the tensors the hop into chunk g carries (g >= 1).
Count pp_step(const std::vector<int64_t>& per_hop, int64_t stage, int64_t stages, int64_t accum) {
    Count c{4 * 8 + 8, 2};
    const auto n = static_cast<int64_t>(per_hop.size());
    for (int64_t g = stage; g < n; g += stages) {
        const int64_t out = g + 1 < n ? per_hop[static_cast<size_t>(g + 1)] : 0;
        const int64_t in = g > 0 ? per_hop[static_cast<size_t>(g)] : 0;
        c.bytes += accum * (out + in) * kBatch * kSeq * kDim * kElem;
        c.calls += accum * 2 * (out + in);  // each tensor's send, and its receive from the other side
    }
    return c;
}

}  // namespace

TEST(TrainerComm, TensorParallelStepMatchesTheFormula) {
    const int64_t n = dist_world().size();
    expect_layout_matches_formula({.tp = n, .dp = 1, .sp = false, .zero = true});
    expect_layout_matches_formula({.tp = n, .dp = 1, .sp = true, .zero = true});
    if (n == 4) expect_layout_matches_formula({.tp = 2, .dp = 2, .sp = true, .zero = true});
}

TEST(TrainerComm, DataParallelStepMatchesTheFormula) {
    const int64_t n = dist_world().size();
    expect_layout_matches_formula({.tp = 1, .dp = n, .sp = true, .zero = true});
    expect_layout_matches_formula({.tp = 1, .dp = n, .sp = true, .zero = false});
}

// One process (every rank its own, over the self communicator): nothing crosses a process, every key is zero.
TEST(TrainerComm, OneProcessReportsZeros) {
    const int rank = dist_world().rank();
    const std::string dir = shared_dir("one"), data = data_dir(), run_dir = fmt::format("{}/one_r{}", dir, rank);
    auto self = comm_make_self();
    Trainer t(mt::testing::mpi_job(data, run_dir, {"train.steps=2", "parallel.dp=1"}), false, self.get());
    t.run();
    expect_traffic("one process", t.comm_traffic(), {});
    expect_metrics("one process", run_dir + "/metrics.jsonl", {}, 2);
}

// pp = n over 8 layers, 1F1B and interleaved (2 chunks per stage), the plain model and Block AttnRes in blocks of 3
// sub-layers (every stage boundary but one cuts a block) with and without the cache; the interleaved schedule's
// AttnRes traffic is smaller with the cache (attnres.md §7: the blocks a stage kept from its previous chunk).
TEST(TrainerComm, PipelineStepMatchesTheFormula) {
    const int64_t n = dist_world().size();
    for (const int64_t v : {1, 2}) {
        std::map<std::string, int64_t> attnres_bytes;
        for (const std::string mode : {"plain", "attnres", "attnres_nocache"}) {
            const std::string name = fmt::format("pp{}_v{}_{}", n, v, mode), dir = shared_dir(name);
            const int64_t accum = v > 1 ? n : kAccum;
            std::vector<std::string> keys = {"model.n_layers=8",
                                             "model.n_kv_heads=4",
                                             "train.steps=2",
                                             "train.grad_accum=" + std::to_string(accum),
                                             "parallel.pp=" + std::to_string(n),
                                             "pp.virtual_stages=" + std::to_string(v),
                                             v > 1 ? "pp.schedule=\"interleaved\"" : "pp.schedule=\"1f1b\""};
            if (mode != "plain") keys.insert(keys.end(), {"attnres.mode=\"block\"", "attnres.block_size=3"});
            if (mode == "attnres_nocache") keys.emplace_back("attnres.pp_cache=false");
            const auto cfg = mt::testing::mpi_job(data_dir(), dir, keys);
            Trainer t(cfg, false);
            const auto chunks = t.pipeline_chunks();
            ASSERT_EQ(static_cast<int64_t>(chunks.size()), n * v);
            std::vector<std::pair<int64_t, int64_t>> sub_layers;
            for (const auto& [first, last] : chunks) sub_layers.emplace_back(2 * first, 2 * last);
            std::vector<int64_t> per_hop(chunks.size(), 1);
            for (size_t g = 1; mode != "plain" && g < chunks.size(); ++g)
                per_hop[g] = static_cast<int64_t>(
                    mt::nn::attnres_hop_sources(sub_layers, static_cast<int64_t>(g), n, mode == "attnres", 3).size());
            const int64_t stage = t.mesh().coord(MeshAxis::pp);
            const Expected want = {{"pp", pp_step(per_hop, stage, n, accum)}, {"world", world_step(cfg)}};
            for (int step = 1; step <= 2; ++step) {
                const Traffic before = t.comm_traffic();
                (void)t.train_step();
                const Traffic got = minus(t.comm_traffic(), before);
                expect_traffic(fmt::format("{} step {} stage {}", name, step, stage), got, want);
                if (mode != "plain")
                    attnres_bytes[mode] = comm_all_reduce_sum(dist_world(), static_cast<double>(got.at("pp").bytes));
            }
        }
        if (dist_world().rank() == 0)
            fmt::print(
                "pp = {} x {} chunks, AttnRes (blocks of 3) pipeline bytes per step, all stages: {} with the "
                "cache, {} without\n",
                n,
                v,
                attnres_bytes["attnres"],
                attnres_bytes["attnres_nocache"]);
        if (v > 1)
            EXPECT_LT(attnres_bytes["attnres"], attnres_bytes["attnres_nocache"]);
        else
            EXPECT_EQ(attnres_bytes["attnres"], attnres_bytes["attnres_nocache"]);  // every hop is a stage's first
    }
}
