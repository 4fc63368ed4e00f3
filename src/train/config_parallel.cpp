// [parallel] checks across keys: what tensor parallelism must divide, what pipeline and context parallelism refuse.
#include "train/config_parallel.h"

#include <fmt/format.h>

#include "parallel/context_parallel.h"

namespace mt::train {

namespace {

[[noreturn]] void bad_key(const std::string& src, const std::string& hint, const std::string& msg) {
    core::fail_hint(core::ExitCode::usage, hint, "{} [{}]", msg, src);
}

void validate_pipeline(const JobConfig& c, const std::string& src) {
    const ParallelConfig& p = c.parallel;
    const nn::ModelConfig& m = c.model;
    auto bad = [&](const std::string& hint, const std::string& msg) { bad_key(src, hint, msg); };
    const int64_t v = p.pp_virtual_stages, chunks = p.pp * v;
    if (v > 1 && p.pp_schedule != "interleaved")
        bad("set pp.schedule = \"interleaved\", or pp.virtual_stages = 1",
            fmt::format("pp.virtual_stages = {} needs pp.schedule = \"interleaved\"", v));
    if (m.n_layers < chunks)
        bad("use fewer pipeline stages or virtual stages",
            fmt::format("model.n_layers = {} is fewer than parallel.pp x pp.virtual_stages = {} x {} pipeline chunks",
                        m.n_layers,
                        p.pp,
                        v));
    if (!p.pp_layers_per_stage.empty()) {
        int64_t sum = 0;
        for (int64_t n : p.pp_layers_per_stage) sum += n;
        if (static_cast<int64_t>(p.pp_layers_per_stage.size()) != chunks || sum != m.n_layers)
            bad("give one layer count per chunk (parallel.pp x pp.virtual_stages of them) summing to model.n_layers",
                fmt::format("pp.layers_per_stage has {} entries summing to {}; the model needs {} chunks summing to "
                            "model.n_layers = {}",
                            p.pp_layers_per_stage.size(),
                            sum,
                            chunks,
                            m.n_layers));
    }
    if (p.pp == 1) return;
    if (p.pp_schedule == "interleaved" && c.train.grad_accum % p.pp != 0)
        bad("set train.grad_accum to a multiple of parallel.pp",
            fmt::format("pp.schedule = \"interleaved\" needs train.grad_accum = {} to be a multiple of parallel.pp = "
                        "{} (Megatron's rule)",
                        c.train.grad_accum,
                        p.pp));
    if (config_may_segment(c) && (m.attnres.enabled() || p.tp > 1))
        bad("set long.segments = 1 and long.segment_tokens = 0, or attnres.mode = \"off\" and parallel.tp = 1",
            "long.segments with parallel.pp > 1 runs without Block AttnRes and tensor parallelism (not built yet)");
}

// Context parallelism (docs/distributed.md "Context parallelism"): the zigzag chunks must be whole multiples of the
// KDA chunk, and what the cp layers do not run yet is refused.
void validate_context_parallel(const JobConfig& c, const std::string& src) {
    const ParallelConfig& p = c.parallel;
    const nn::ModelConfig& m = c.model;
    if (p.cp <= 1) return;
    auto bad = [&](const std::string& hint, const std::string& msg) { bad_key(src, hint, msg); };
    if (m.moe_enabled && (m.moe.capacity_factor > 0.0 || m.moe.balance.mode == nn::MoeBalanceMode::aux_loss))
        bad("use dropless MoE (moe.capacity_factor = 0) with quantile, sign_bias or no balancing",
            fmt::format("parallel.cp = {} with moe.capacity_factor > 0 or moe.balance = \"aux_loss\": each cp rank "
                        "routes its own tokens, and both are per batch",
                        p.cp));
    const int64_t granule = parallel::cp_granularity(p.cp);
    auto length = [&](int64_t seq, const std::string& key) {
        if (seq % granule != 0)
            bad(fmt::format("use a {} that is a multiple of {}, or another parallel.cp", key, granule),
                fmt::format("{} = {} is not a multiple of 2 x parallel.cp x {} = {}: context parallelism cuts every "
                            "sequence into 2 x {} chunks of whole {}-token blocks",
                            key,
                            seq,
                            parallel::kCpGranule,
                            granule,
                            p.cp,
                            parallel::kCpGranule));
    };
    length(c.train.seq_len, "train.seq_len");
    if (m.segments.tokens > 0) length(m.segments.tokens, "long.segment_tokens");  // every segment zigzagged alone
    for (size_t i = 0; i < c.long_ctx.stages.size(); ++i)
        length(c.long_ctx.stages[i].seq_len, fmt::format("long.stages[{}].seq_len", i));
}

}  // namespace

void config_parallel_validate(const JobConfig& c, const std::string& src) {
    validate_pipeline(c, src);
    validate_context_parallel(c, src);
    const ParallelConfig& p = c.parallel;
    const nn::ModelConfig& m = c.model;
    if (p.tp <= 1) return;
    auto bad = [&](const std::string& hint, const std::string& msg) { bad_key(src, hint, msg); };
    auto divides = [&](const char* key, int64_t value, const char* what) {
        if (value % p.tp != 0)
            bad(fmt::format("choose a parallel.tp that divides {} (docs/distributed.md)", key),
                fmt::format("{} = {} is not divisible by parallel.tp = {}: tensor parallelism splits {}",
                            key,
                            value,
                            p.tp,
                            what));
    };
    divides("model.n_heads", m.n_heads, "the query heads");
    // Fewer key/value heads than tp ranks: each is replicated on tp / n_kv_heads ranks (vLLM's rule), which needs
    // tp to be a multiple of them.
    if (p.tp > m.n_kv_heads ? p.tp % m.n_kv_heads != 0 : m.n_kv_heads % p.tp != 0)
        bad("choose a parallel.tp that divides model.n_kv_heads or is a multiple of it (docs/distributed.md)",
            fmt::format("model.n_kv_heads = {} and parallel.tp = {}: tensor parallelism splits the key/value heads "
                        "or replicates each on tp / n_kv_heads ranks, so one must divide the other",
                        m.n_kv_heads,
                        p.tp));
    if (m.n_layers > m.n_moe_layers()) divides("model.d_ff", m.dense_ffn_dim(), "the MLP's hidden features");
    if (!p.pad_vocab) divides("model.vocab_size", m.vocab_size, "the vocabulary (parallel.pad_vocab = false)");
    const int64_t shard = (m.vocab_size + p.tp - 1) / p.tp;
    if (shard * (p.tp - 1) >= m.vocab_size)
        bad("use a smaller parallel.tp",
            fmt::format("model.vocab_size = {} leaves the last of parallel.tp = {} vocabulary shards of {} rows empty",
                        m.vocab_size,
                        p.tp,
                        shard));
    if (m.n_kda_layers() > 0) {
        divides("kda.num_heads", m.kda_num_heads(), "KDA's key heads");
        divides("kda.num_v_heads", m.kda_num_v_heads(), "KDA's value heads");
    }
    if (m.moe_enabled) {
        // The routed experts are spread over tp x ep, each tp rank routing its own token rows.
        if (m.moe.num_experts % (p.tp * p.ep) != 0)
            bad("choose parallel.tp x parallel.ep dividing moe.num_experts (docs/distributed.md)",
                fmt::format("moe.num_experts = {} is not divisible by parallel.tp x parallel.ep = {} x {}: under "
                            "tensor parallelism the tp ranks hold experts too",
                            m.moe.num_experts,
                            p.tp,
                            p.ep));
        if (m.moe.num_shared_experts > 0)
            divides("moe.expert_ffn_dim x moe.num_shared_experts",
                    m.moe.expert_ffn_dim * m.moe.num_shared_experts,
                    "the shared experts' hidden features");
        if (m.moe.capacity_factor > 0.0 || m.moe.balance.mode == nn::MoeBalanceMode::aux_loss)
            bad("use dropless MoE (moe.capacity_factor = 0) with quantile, sign_bias or no balancing",
                "parallel.tp > 1 with moe.capacity_factor > 0 or moe.balance = \"aux_loss\": each tp rank routes "
                "its own share of the token rows, and both are per batch");
    }
    if (!p.sequence_parallel) return;
    // Under context parallelism the rows split over tp are a cp rank's, batch_size x seq_len / cp.
    auto rows = [&](int64_t seq, const std::string& where) {
        if (c.train.batch_size * seq / p.cp % p.tp != 0)
            bad("set parallel.sequence_parallel = false, or a batch whose token rows divide by parallel.tp",
                fmt::format("train.batch_size x {}{} = {} x {}{} is not divisible by parallel.tp = {}: sequence "
                            "parallelism splits the token rows",
                            where,
                            p.cp > 1 ? " / parallel.cp" : "",
                            c.train.batch_size,
                            seq,
                            p.cp > 1 ? fmt::format(" / {}", p.cp) : "",
                            p.tp));
    };
    rows(c.train.seq_len, "train.seq_len");
    for (size_t i = 0; i < c.long_ctx.stages.size(); ++i)
        rows(c.long_ctx.stages[i].seq_len, fmt::format("long.stages[{}].seq_len", i));
}

parallel::MeshShape config_mesh_shape(const JobConfig& c, int64_t world) {
    const ParallelConfig& p = c.parallel;
    return parallel::mesh_resolve({.tp = p.tp, .cp = p.cp, .ep = p.ep, .dp = p.dp, .pp = p.pp},
                                  world,
                                  {.moe = c.model.moe_enabled, .num_experts = c.model.moe.num_experts},
                                  c.source);
}

}  // namespace mt::train
