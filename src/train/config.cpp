// Job config parsing and validation against the schema (train/config_schema.h), the cross-key checks, the resolved
// TOML and the upgrade of an older version's saved config.
#include "train/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "data/shapes_vocab.h"
#include "data/tokenizer.h"
#include "ops/attnres_mix.h"
#include "train/config_long.h"
#include "train/config_parallel.h"
#include "train/config_schema.h"
#include "train/config_sources.h"
#include "train/http_endpoint.h"

namespace mt::train {

namespace {

using core::ExitCode;

size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j)
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

[[noreturn]] void fail_unknown_key(const std::string& key, const std::vector<Field>& fields, const std::string& src) {
    const Field* best = nullptr;
    size_t best_d = 4;
    for (const auto& f : fields) {
        const size_t dist = edit_distance(key, f.key);
        if (dist < best_d) {
            best_d = dist;
            best = &f;
        }
    }
    core::fail_hint(ExitCode::usage,
                    best ? "did you mean `" + best->key + "`?" : "see docs/configs.md for the keys",
                    "unknown config key `{}` [{}]",
                    key,
                    src);
}

void fail_removed_key(const std::string& key, const std::string& src) {
    for (const RemovedKey& r : config_removed_keys())
        if (key == r.key)
            core::fail_hint(
                ExitCode::usage, r.hint, "config key `{}` was removed: write {} instead [{}]", key, r.replacement, src);
}

std::string type_name(const FieldPtr& p) {
    if (std::holds_alternative<int64_t*>(p)) return "an integer";
    if (std::holds_alternative<double*>(p)) return "a number";
    if (std::holds_alternative<bool*>(p)) return "true or false";
    if (std::holds_alternative<std::vector<int64_t>*>(p)) return "an array of integers";
    if (std::holds_alternative<std::vector<std::string>*>(p) || std::holds_alternative<EnumListField>(p))
        return "an array of strings";
    return "a string";
}

// `text` is the value as written for the message (an integer key prints as an integer, not as 9.22e+18).
void check_range(const Field& f, double v, const std::string& text, const std::string& src) {
    const bool low = f.min_exclusive ? v <= f.min : v < f.min, high = f.max_exclusive ? v >= f.max : v > f.max;
    if (!(low || high || std::isnan(v))) return;
    const bool integer =
        std::holds_alternative<int64_t*>(f.ptr) || std::holds_alternative<std::vector<int64_t>*>(f.ptr);
    auto bound = [&](double b) {
        return integer && std::isfinite(b) ? fmt::format("{}", static_cast<int64_t>(b)) : fmt::format("{}", b);
    };
    core::fail(ExitCode::usage,
               "config value {} = {} is out of range: must be {} {} and {} {} [{}]",
               f.key,
               text,
               f.min_exclusive ? ">" : ">=",
               bound(f.min),
               f.max_exclusive ? "<" : "<=",
               bound(f.max),
               src);
}

// The position of `value` among a key's allowed values; fails naming the key and listing them.
size_t choice_index(const std::string& key,
                    const std::vector<std::string>& choices,
                    const std::string& value,
                    const std::string& src) {
    const auto it = std::find(choices.begin(), choices.end(), value);
    if (it == choices.end())
        core::fail(ExitCode::usage,
                   "config value {} = \"{}\" is not one of: {} [{}]",
                   key,
                   value,
                   fmt::join(choices, ", "),
                   src);
    return static_cast<size_t>(it - choices.begin());
}

void assign(const Field& f, const toml::node& node, const std::string& src) {
    auto wrong_type = [&]() {
        core::fail(ExitCode::usage,
                   "config value {} must be {}, got {} [{}]",
                   f.key,
                   type_name(f.ptr),
                   toml::impl::node_type_friendly_names[static_cast<size_t>(node.type())],
                   src);
    };
    std::visit(
        [&](auto& ptr) {
            using T = std::remove_pointer_t<std::remove_cvref_t<decltype(ptr)>>;
            if constexpr (std::is_same_v<T, int64_t>) {
                if (node.is_string() && !f.choices.empty()) {  // a word the integer key also takes: word i is -i
                    *ptr = -static_cast<int64_t>(choice_index(f.key, f.choices, node.as_string()->get(), src));
                    return;
                }
                if (!node.is_integer())
                    core::fail(ExitCode::usage,
                               "config value {} must be an integer{}, got {} [{}]",
                               f.key,
                               f.choices.empty() ? "" : fmt::format(" or one of: {}", fmt::join(f.choices, ", ")),
                               toml::impl::node_type_friendly_names[static_cast<size_t>(node.type())],
                               src);
                *ptr = node.as_integer()->get();
                check_range(f, static_cast<double>(*ptr), fmt::format("{}", *ptr), src);
            } else if constexpr (std::is_same_v<T, double>) {
                if (!node.is_number()) wrong_type();
                *ptr =
                    node.is_integer() ? static_cast<double>(node.as_integer()->get()) : node.as_floating_point()->get();
                check_range(f, *ptr, fmt::format("{}", *ptr), src);
            } else if constexpr (std::is_same_v<T, bool>) {
                if (!node.is_boolean()) wrong_type();
                *ptr = node.as_boolean()->get();
            } else if constexpr (std::is_same_v<T, std::string>) {
                if (!node.is_string()) wrong_type();
                *ptr = node.as_string()->get();
                if (!f.choices.empty()) choice_index(f.key, f.choices, *ptr, src);
            } else if constexpr (std::is_same_v<T, EnumField>) {
                if (!node.is_string()) wrong_type();
                ptr.set(choice_index(f.key, f.choices, node.as_string()->get(), src));
            } else if constexpr (std::is_same_v<T, EnumListField>) {
                const toml::array* arr = node.as_array();
                if (arr == nullptr) wrong_type();
                std::vector<size_t> idx;
                for (const auto& el : *arr) {
                    if (!el.is_string()) wrong_type();
                    idx.push_back(choice_index(f.key, f.choices, el.as_string()->get(), src));
                }
                ptr.set(idx);
            } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
                const toml::array* arr = node.as_array();
                if (arr == nullptr) wrong_type();
                ptr->clear();
                for (const auto& el : *arr) {
                    if (!el.is_integer()) wrong_type();
                    ptr->push_back(el.as_integer()->get());
                    check_range(f, static_cast<double>(ptr->back()), fmt::format("{}", ptr->back()), src);
                }
            } else {
                const toml::array* arr = node.as_array();
                if (arr == nullptr) wrong_type();
                ptr->clear();
                for (const auto& el : *arr) {
                    if (!el.is_string()) wrong_type();
                    ptr->push_back(el.as_string()->get());
                }
            }
        },
        f.ptr);
}

// Assigns every key of a section; a nested table ([moe.quantile]) names its keys "moe.quantile.<key>".
void assign_table(const toml::table& table,
                  const std::string& prefix,
                  const std::vector<Field>& fields,
                  const std::string& source) {
    for (const auto& [name, value] : table) {
        const std::string key = prefix + "." + std::string(name.str());
        auto it = std::find_if(fields.begin(), fields.end(), [&](const Field& f) { return f.key == key; });
        if (it == fields.end() && value.is_table()) {
            assign_table(*value.as_table(), key, fields, source);
            continue;
        }
        if (it == fields.end()) {
            fail_removed_key(key, source);  // returns when the key never existed
            fail_unknown_key(key, fields, source);
        }
        assign(*it, value, source);
    }
}

// The table at a dotted path under root ("moe.quantile"), created when missing; null when a segment is not a table.
toml::table* table_at(toml::table& root, const std::string& path) {
    toml::table* t = &root;
    size_t begin = 0;
    while (t != nullptr && begin <= path.size()) {
        const size_t dot = std::min(path.find('.', begin), path.size());
        const std::string name = path.substr(begin, dot - begin);
        if (!t->contains(name)) t->insert(name, toml::table{});
        t = (*t)[name].as_table();
        begin = dot + 1;
    }
    return t;
}

// Parses "section.key=value" into the table; a value that is not valid TOML is taken as a bare string.
void apply_override(toml::table& root, const std::string& item) {
    const size_t eq = item.find('=');
    const size_t dot = item.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq)
        core::fail_hint(ExitCode::usage,
                        "write it as section.key=value, e.g. --set train.steps=100",
                        "malformed override `{}`",
                        item);
    const std::string value = item.substr(eq + 1);
    toml::table parsed;
    try {
        parsed = toml::parse("v = " + value);
    } catch (const toml::parse_error& e) {
        // A bare word is a string; a value that starts like a number, an array or a quoted string was meant as one,
        // so its TOML error is the message (an integer beyond 64 bits is not the string it would otherwise become).
        static const std::regex kMeant(R"(\s*([+-]?[0-9_]+(\.[0-9_]+)?([eE][+-]?[0-9]+)?|[\[{"'].*)\s*)");
        if (std::regex_match(value, kMeant))
            core::fail(ExitCode::usage, "override `{}`: the value is not valid TOML: {}", item, e.description());
        parsed = toml::table{{"v", value}};
    }
    // "moe.quantile.bins" sets bins in the nested table moe.quantile, where a file's [moe.quantile] puts it.
    const size_t last = item.rfind('.', eq);
    const std::string table_path = item.substr(0, last), leaf = item.substr(last + 1, eq - last - 1);
    toml::table* sec = table_at(root, table_path);
    if (sec == nullptr) core::fail(ExitCode::usage, "override `{}`: `{}` is not a section", item, table_path);
    sec->insert_or_assign(leaf, *parsed.get("v"));
}

}  // namespace

nn::Precision config_precision(const JobConfig& cfg, bool cuda) {
    const std::string& precision = cfg.run.precision;
    if (!cuda) {
        if (precision != "auto" && precision != "f32")
            core::fail_hint(ExitCode::usage,
                            "set run.precision = \"f32\" (or \"auto\") for CPU runs",
                            "run.precision = \"{}\" needs a GPU; this run is on the CPU, whose ops compute in f32 [{}]",
                            precision,
                            cfg.source);
        return nn::Precision::cpu(core::DType::f32);
    }
    if (precision == "f32") return nn::Precision::cuda_f32();
    return nn::Precision::cuda_mixed(precision == "fp16" ? core::DType::f16 : core::DType::bf16);
}

core::DType config_state_dtype(const JobConfig& cfg, core::DType master) {
    return cfg.optim.state_dtype == "bf16" ? core::DType::bf16 : master;
}

namespace {

void validate(const JobConfig& c, const std::string& src) {
    const auto& m = c.model;
    auto bad = [&](const std::string& msg) { core::fail(ExitCode::usage, "{} [{}]", msg, src); };
    if (m.head_dim == 0 && m.d_model % m.n_heads != 0)
        bad(fmt::format("model.d_model = {} is not divisible by model.n_heads = {}", m.d_model, m.n_heads));
    if (m.n_heads % m.n_kv_heads != 0)
        bad(fmt::format("model.n_heads = {} is not divisible by model.n_kv_heads = {}", m.n_heads, m.n_kv_heads));
    if (m.layer_pattern.empty() || m.layer_pattern.find_first_not_of("AK") != std::string::npos)
        bad(fmt::format("model.layer_pattern = \"{}\" must be a non-empty string of A (attention) and K (KDA)",
                        m.layer_pattern));
    if (m.n_layers % static_cast<int64_t>(m.layer_pattern.size()) != 0)
        bad(
            fmt::format("model.layer_pattern = \"{}\" has length {}, which does not divide model.n_layers = {} (the "
                        "pattern repeats to cover the layers)",
                        m.layer_pattern,
                        m.layer_pattern.size(),
                        m.n_layers));
    const bool attention = m.n_layers > m.n_kda_layers() || m.n_layers == 0;
    if (attention && m.attn_rope() && m.resolved_head_dim() % 2 != 0)
        bad(fmt::format("head dimension {} must be even for RoPE (model.attn_pos)", m.resolved_head_dim()));
    if (!m.attn.window_layers.empty() && m.attn.window_rope_base > 0 && m.resolved_head_dim() % 2 != 0)
        bad(
            fmt::format("head dimension {} must be even for the window layers' RoPE (attn.window_rope_base = {}; 0 "
                        "turns it off)",
                        m.resolved_head_dim(),
                        m.attn.window_rope_base));
    if (m.kda.chunk_size != 32 && m.kda.chunk_size != 64)
        bad(fmt::format("kda.chunk_size = {} must be 32 or 64", m.kda.chunk_size));
    if (m.n_kda_layers() > 0 && m.kda_num_v_heads() % m.kda_num_heads() != 0)
        bad(
            fmt::format("kda.num_v_heads = {} is not a multiple of the KDA q/k heads {} (kda.num_heads, or "
                        "model.n_heads when 0)",
                        m.kda_num_v_heads(),
                        m.kda_num_heads()));
    if (m.n_kda_layers() > 0 && m.kda_head_dim() > 256)
        bad(fmt::format("KDA key head dimension {} exceeds 256 (kda.head_dim, or the model's head dimension when 0)",
                        m.kda_head_dim()));
    if (m.attnres.enabled() && m.attnres.max_sources(m.n_layers) > ops::kAttnResMaxSources)
        bad(fmt::format(
            "attnres.mode = \"{}\" in blocks of {} sub-layers over model.n_layers = {} needs {} sources per "
            "mix; at most {} are supported (raise attnres.block_size)",
            nn::enum_name(m.attnres.mode),
            m.attnres.resolved_block_size(),
            m.n_layers,
            m.attnres.max_sources(m.n_layers),
            ops::kAttnResMaxSources));
    if (m.moe_enabled) {
        if (m.moe.balance.mode == nn::MoeBalanceMode::quantile && m.moe.balance.ema >= 1.0)
            bad(fmt::format("moe.quantile.ema = {} is out of range: must be in [0, 1)", m.moe.balance.ema));
        if (m.moe.top_k > m.moe.num_experts)
            bad(fmt::format("moe.top_k = {} exceeds moe.num_experts = {}", m.moe.top_k, m.moe.num_experts));
        const nn::MoeBalanceMode balance = m.moe.balance.mode;
        const bool uses_bias = balance == nn::MoeBalanceMode::quantile || balance == nn::MoeBalanceMode::sign_bias;
        if (uses_bias && m.moe.num_experts <= m.moe.top_k)
            bad(fmt::format("moe.balance = \"{}\" needs moe.num_experts ({}) above moe.top_k ({})",
                            nn::enum_name(balance),
                            m.moe.num_experts,
                            m.moe.top_k));
    }
    const nn::RecomputeConfig& rc = m.recompute;
    if (rc.policy == nn::RecomputePolicy::selective && rc.modules.empty())
        bad("recompute.policy = \"selective\" needs recompute.modules: the modules whose activations to drop");
    if (rc.policy != nn::RecomputePolicy::selective && !rc.modules.empty())
        bad(fmt::format("recompute.modules is set, but recompute.policy = \"{}\" ignores it (use \"selective\")",
                        nn::enum_name(rc.policy)));
    if (rc.full() && rc.every > m.n_layers)
        bad(fmt::format("recompute.every = {} exceeds model.n_layers = {}", rc.every, m.n_layers));
    if (rc.full() && m.attnres.enabled() && rc.every != 1)
        bad(
            fmt::format("recompute.every = {} with attnres.mode = \"{}\": under AttnRes, recompute full re-runs each "
                        "sub-layer from its mixed input, so every must be 1",
                        rc.every <= 0 ? std::string("\"sqrt\"") : std::to_string(rc.every),
                        nn::enum_name(m.attnres.mode)));
    if (c.optim.offload != "none" && c.optim.name != "adamw")
        bad(fmt::format(
            "optim.offload = \"{}\" supports optim.name = \"adamw\" only, not \"{}\"", c.optim.offload, c.optim.name));
    if (c.compress.level > 0 && (c.optim.name != "muon" || c.parallel.zero_stage < 1))
        bad(
            fmt::format("compress.level = {} compresses Muon's reduce-to-owner leg (muon.md §6), which needs "
                        "optim.name = \"muon\" and parallel.zero_stage = 1",
                        c.compress.level));
    if (c.train.seq_len > m.max_seq_len)
        bad(fmt::format("train.seq_len = {} exceeds model.max_seq_len = {}", c.train.seq_len, m.max_seq_len));
    if (!m.attn.window_layers.empty() && m.attn.window > m.max_seq_len)
        bad(fmt::format("attn.window = {} exceeds model.max_seq_len = {}", m.attn.window, m.max_seq_len));
    for (int64_t layer : m.attn.window_layers) {
        if (layer > m.n_layers)
            bad(fmt::format("attn.window_layers names layer {}, but model.n_layers = {}", layer, m.n_layers));
        if (m.layer_is_kda(layer - 1))
            bad(
                fmt::format("attn.window_layers names layer {}, a KDA layer of model.layer_pattern = \"{}\": only "
                            "attention layers take a window",
                            layer,
                            m.layer_pattern));
    }
    const nn::SegmentConfig& sg = m.segments;
    if (sg.count > 1 && sg.tokens > 0)
        bad(fmt::format("long.segments = {} and long.segment_tokens = {}: give one of them", sg.count, sg.tokens));
    if (sg.tokens > 0 && m.n_kda_layers() > 0 && sg.tokens % m.kda.chunk_size != 0)
        bad(
            fmt::format("long.segment_tokens = {} is not a multiple of kda.chunk_size = {}: segment boundaries fall "
                        "on KDA chunks",
                        sg.tokens,
                        m.kda.chunk_size));
    if (sg.offload_kv && !sg.enabled())
        bad("long.offload_kv = true needs sequence segments (long.segments > 1 or long.segment_tokens > 0): without "
            "them no layer keeps a cache");
    if (!c.long_ctx.segment_recompute)
        bad("long.segment_recompute = false is not offered: holding every segment's activations needs the memory of "
            "one pass plus the caches (use long.segments = 1)");
    const bool segmented = config_may_segment(c);  // long.tokens_per_gpu may cut a stage into segments
    if (segmented && m.moe_enabled && m.moe.capacity_factor > 0)
        bad(
            fmt::format("long.segments with moe.capacity_factor = {}: expert capacity is per batch, so segments "
                        "would drop other tokens; segments need dropless MoE (moe.capacity_factor = 0)",
                        m.moe.capacity_factor));
    if (segmented && m.moe_enabled && m.moe.balance.mode == nn::MoeBalanceMode::aux_loss)
        bad("long.segments with moe.balance = \"aux_loss\": the auxiliary loss is per batch, not a sum over "
            "tokens, so segments would change it; use quantile or sign_bias balancing");
    if (c.data.paths.empty() && c.data.format != "shapes") bad("data.paths is empty: name at least one training shard");
    if (m.document_mask && m.eot_token >= m.vocab_size)
        bad(fmt::format("data.eot_token = {} is outside model.vocab_size = {}", m.eot_token, m.vocab_size));
    if (c.run.dir.empty()) bad("run.dir is empty: name the directory for checkpoints and metrics");
    if (!http_address_valid(c.metrics.bind))
        bad(fmt::format("metrics.bind = \"{}\" is not a numeric IPv4 or IPv6 address (e.g. 127.0.0.1)",
                        c.metrics.bind));
}

}  // namespace

JobConfig config_parse(const std::string& toml_text,
                       const std::string& source,
                       const std::vector<std::string>& overrides) {
    toml::table root;
    try {
        root = toml::parse(toml_text, source);
    } catch (const toml::parse_error& e) {
        core::fail(ExitCode::usage,
                   "malformed TOML: {} at line {}, column {} [{}]",
                   e.description(),
                   e.source().begin.line,
                   e.source().begin.column,
                   source);
    }
    for (const auto& item : overrides) apply_override(root, item);

    JobConfig c;
    c.source = source;
    config_long_take_stages(root, c, source);
    const std::vector<toml::table> source_tables = config_sources_take(root, source);
    const std::vector<Field> fields = config_schema(c);
    for (const auto& [section, node] : root) {
        const std::string sec(section.str());
        const toml::table* table = node.as_table();
        const bool known_section =
            std::any_of(fields.begin(), fields.end(), [&](const Field& f) { return f.key.rfind(sec + ".", 0) == 0; });
        if (table == nullptr && known_section)
            core::fail_hint(ExitCode::usage,
                            fmt::format("write the keys under a [{}] table, e.g. [{}] then key = value", sec, sec),
                            "config value `{}` must be a table, got {} [{}]",
                            sec,
                            toml::impl::node_type_friendly_names[static_cast<size_t>(node.type())],
                            source);
        if (table == nullptr) fail_unknown_key(sec, fields, source);
        assign_table(*table, sec, fields, source);
    }
    config_sources_apply(c, source_tables, source);
    // Document masking without an explicit data.eot_token ends documents at the tokenizer's EOT (a SentencePiece
    // model is opened for its eos id: a missing or bad model exits 3 naming the file).
    if (c.model.document_mask && c.model.eot_token < 0)
        c.model.eot_token =
            c.data.format == "shapes" ? data::kShapesEos : data::tokenizer_open(c.data.tokenizer)->eot_id();
    config_vision_defaults(c);
    // Each source is checked as the job's one source would be (its own name in the messages).
    for (size_t i = 0; i < std::max<size_t>(1, c.data_sources.size()); ++i) {
        const JobConfig view = c.data_sources.empty() ? c : config_source_view(c, i);
        const std::string where = c.data_sources.empty() ? source : fmt::format("{}, data.sources[{}]", source, i);
        validate(view, where);
        config_long_validate(view, where);
        config_parallel_validate(view, where);
        config_vision_validate(view, where);
    }
    return c;
}

JobConfig config_load(const std::string& path, const std::vector<std::string>& overrides) {
    // The type first: a directory would read as an empty config and a FIFO would block the open.
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
        core::fail(ExitCode::usage,
                   "cannot read config file: not a regular file ({}) [{}]",
                   std::filesystem::is_directory(status) ? "a directory" : "a special file",
                   path);
    std::ifstream in(path, std::ios::binary);
    if (!in) core::fail(ExitCode::usage, "cannot read config file [{}]", path);
    std::stringstream ss;
    ss << in.rdbuf();
    return config_parse(ss.str(), path, overrides);
}

std::string config_upgrade_saved(const std::string& saved_toml) {
    toml::table root;
    try {
        root = toml::parse(saved_toml);
    } catch (const toml::parse_error&) {
        return saved_toml;
    }
    bool changed = false;
    // The old resolved config wrote model.residual reconciled with attnres.mode, which it also wrote.
    if (toml::table* model = root["model"].as_table()) changed = model->erase("residual") > 0;
    if (toml::table* kda = root["kda"].as_table()) {
        std::string save = "none";
        bool old_keys = false;
        for (const char* level : {"tiles", "states", "workspace"}) {  // the highest level set wins
            const std::string old_key = std::string("save_") + level;
            if (!kda->contains(old_key)) continue;
            old_keys = true;
            if ((*kda)[old_key].value_or(false)) save = level;
            kda->erase(old_key);
        }
        if (old_keys && !kda->contains("save")) kda->insert("save", save);
        changed = changed || old_keys;
    }
    if (!changed) return saved_toml;
    std::ostringstream out;
    out << root << "\n";
    return out.str();
}

toml::table config_resolved_table(const JobConfig& c) {
    JobConfig copy = c;
    toml::table root;
    for (const auto& f : config_schema(copy)) {
        const size_t dot = f.key.rfind('.');
        const std::string sec = f.key.substr(0, dot), key = f.key.substr(dot + 1);
        toml::table& t = *table_at(root, sec);
        std::visit(
            [&](auto& ptr) {
                using T = std::remove_pointer_t<std::remove_cvref_t<decltype(ptr)>>;
                if constexpr (std::is_same_v<T, std::vector<std::string>> || std::is_same_v<T, std::vector<int64_t>>) {
                    toml::array arr;
                    for (const auto& s : *ptr) arr.push_back(s);
                    t.insert(key, arr);
                } else if constexpr (std::is_same_v<T, EnumField>) {
                    t.insert(key, f.choices[ptr.get()]);
                } else if constexpr (std::is_same_v<T, EnumListField>) {
                    toml::array arr;
                    for (size_t i : ptr.get()) arr.push_back(f.choices[i]);
                    t.insert(key, arr);
                } else if constexpr (std::is_same_v<T, int64_t>) {
                    if (*ptr <= 0 && !f.choices.empty())
                        t.insert(key, f.choices[static_cast<size_t>(-*ptr)]);
                    else
                        t.insert(key, *ptr);
                } else {
                    t.insert(key, *ptr);
                }
            },
            f.ptr);
    }
    return root;
}

void config_assign_table(const toml::table& table, const std::string& prefix, JobConfig& c, const std::string& src) {
    assign_table(table, prefix, config_schema(c), src);
}

std::string JobConfig::to_toml() const {
    toml::table root = config_resolved_table(*this);
    config_long_put_stages(*this, root);
    config_sources_put(*this, root);
    std::ostringstream out;
    out << root << "\n";
    return out.str();
}

}  // namespace mt::train
