// Parsing, checking and writing of `[[long.stages]]`: each entry's keys by name, with the stage index in every
// message, so a bad stage is found without counting tables by hand.
#include "train/config_long.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "parallel/context_parallel.h"

namespace mt::train {

namespace {

using core::ExitCode;

const char* const kStageKeys[] = {"seq_len", "tokens", "long_fraction", "rope_base"};

std::string node_type(const toml::node& n) {
    return std::string(toml::impl::node_type_friendly_names[static_cast<size_t>(n.type())]);
}

int64_t stage_integer(const toml::node& n, const std::string& key, int64_t lo, const std::string& src) {
    if (!n.is_integer())
        core::fail(ExitCode::usage, "config value {} must be an integer, got {} [{}]", key, node_type(n), src);
    const int64_t v = n.as_integer()->get();
    if (v < lo)
        core::fail(ExitCode::usage, "config value {} = {} is out of range: must be >= {} [{}]", key, v, lo, src);
    return v;
}

double stage_number(const toml::node& n, const std::string& key, double lo, double hi, const std::string& src) {
    if (!n.is_number())
        core::fail(ExitCode::usage, "config value {} must be a number, got {} [{}]", key, node_type(n), src);
    const double v = n.is_integer() ? static_cast<double>(n.as_integer()->get()) : n.as_floating_point()->get();
    if (!(v >= lo && v <= hi))
        core::fail(
            ExitCode::usage, "config value {} = {} is out of range: must be >= {} and <= {} [{}]", key, v, lo, hi, src);
    return v;
}

}  // namespace

void config_long_take_stages(toml::table& root, JobConfig& c, const std::string& src) {
    toml::table* sec = root["long"].as_table();
    if (sec == nullptr || !sec->contains("stages")) return;
    const toml::node& node = *sec->get("stages");
    const toml::array* arr = node.as_array();
    if (arr == nullptr)
        core::fail_hint(ExitCode::usage,
                        "write each stage as a [[long.stages]] table with seq_len, tokens and long_fraction",
                        "config value long.stages must be an array of tables, got {} [{}]",
                        node_type(node),
                        src);
    std::vector<LongStage> stages;
    for (size_t i = 0; i < arr->size(); ++i) {
        const std::string at = fmt::format("long.stages[{}]", i);
        const toml::table* t = (*arr)[i].as_table();
        if (t == nullptr)
            core::fail(ExitCode::usage, "config value {} must be a table, got {} [{}]", at, node_type((*arr)[i]), src);
        LongStage s;
        for (const auto& [name, value] : *t) {
            const std::string key = at + "." + std::string(name.str());
            if (name == "seq_len") {
                s.seq_len = stage_integer(value, key, 1, src);
            } else if (name == "tokens") {
                s.tokens = stage_integer(value, key, 1, src);
            } else if (name == "long_fraction") {
                s.long_fraction = stage_number(value, key, 0.0, 1.0, src);
            } else if (name == "rope_base") {
                s.rope_base = stage_number(value, key, 0.0, 1e12, src);
            } else {
                core::fail_hint(ExitCode::usage,
                                fmt::format("a stage takes {}", fmt::join(kStageKeys, ", ")),
                                "unknown config key `{}` [{}]",
                                key,
                                src);
            }
        }
        for (const char* required : {"seq_len", "tokens"})
            if (!t->contains(required))
                core::fail(
                    ExitCode::usage, "config value {}.{} is missing: every stage needs it [{}]", at, required, src);
        stages.push_back(s);
    }
    c.long_ctx.stages = std::move(stages);
    sec->erase("stages");
}

void config_long_validate(const JobConfig& c, const std::string& src) {
    const auto& stages = c.long_ctx.stages;
    const auto& m = c.model;
    auto bad = [&](const std::string& msg) { core::fail(ExitCode::usage, "{} [{}]", msg, src); };
    for (size_t i = 0; i < stages.size(); ++i) {
        const LongStage& s = stages[i];
        if (i > 0 && s.seq_len <= stages[i - 1].seq_len)
            bad(fmt::format(
                "long.stages[{}].seq_len = {} is not above long.stages[{}].seq_len = {}: stages run in order of "
                "increasing length",
                i,
                s.seq_len,
                i - 1,
                stages[i - 1].seq_len));
        if (s.seq_len > m.max_seq_len)
            bad(fmt::format("long.stages[{}].seq_len = {} exceeds model.max_seq_len = {} (it must cover every stage)",
                            i,
                            s.seq_len,
                            m.max_seq_len));
        // The base applies to the global (not window) attention layers that use RoPE.
        const bool rope = m.n_layers > m.n_kda_layers() + m.n_window_layers() && m.attn_rope();
        if (s.rope_base != 0.0 && !rope)
            bad(
                fmt::format("long.stages[{}].rope_base = {} is set, but the model has no RoPE attention layer "
                            "(model.attn_pos, model.layer_pattern)",
                            i,
                            s.rope_base));
    }
}

nn::SegmentConfig config_segments_for_length(const JobConfig& c, int64_t seq_len) {
    const nn::ModelConfig& m = c.model;
    const int64_t target = c.long_ctx.tokens_per_gpu, cp = std::max<int64_t>(c.parallel.cp, 1);
    const int64_t rows = std::max<int64_t>(c.train.batch_size, 1);
    if (target <= 0 || m.segments.enabled() || rows * seq_len / cp <= target) return m.segments;
    const int64_t granule = cp > 1 ? parallel::cp_granularity(cp) : m.n_kda_layers() > 0 ? m.kda.chunk_size : 64;
    nn::SegmentConfig out = m.segments;
    // The longest segment whose rows fit: S tokens of a row hold batch_size x S / cp per rank.
    out.tokens = std::max<int64_t>(target * cp / rows / granule, 1) * granule;
    if (out.tokens >= seq_len) out.tokens = 0;
    return out;
}

bool config_may_segment(const JobConfig& c) {
    if (c.long_ctx.stages.empty()) return config_segments_for_length(c, c.train.seq_len).enabled();
    for (const LongStage& s : c.long_ctx.stages)
        if (config_segments_for_length(c, s.seq_len).enabled()) return true;
    return false;
}

void config_long_put_stages(const JobConfig& c, toml::table& root) {
    if (c.long_ctx.stages.empty()) return;
    toml::array arr;
    for (const LongStage& s : c.long_ctx.stages) {
        toml::table t{{"seq_len", s.seq_len}, {"tokens", s.tokens}, {"rope_base", s.rope_base}};
        if (s.long_fraction >= 0.0) t.insert("long_fraction", s.long_fraction);  // left out: the natural mix
        arr.push_back(std::move(t));
    }
    if (!root.contains("long")) root.insert("long", toml::table{});
    root["long"].as_table()->insert_or_assign("stages", std::move(arr));
}

}  // namespace mt::train
