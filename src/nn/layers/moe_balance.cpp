// MoE load balancing: QB's histogram and its quantile update, the sign rule, the aux loss, and the state's
// checkpoint form (moe.md §2).
#include "nn/layers/moe_balance.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/moe_balance.h"

namespace mt::nn {

using core::DType;
using core::ExitCode;
using core::Tensor;

MoeBalancer::MoeBalancer(int64_t num_experts, int64_t top_k, const MoeBalanceConfig& config)
    : n_(num_experts), k_(top_k), config_(config) {
    const bool uses_bias = config.mode == MoeBalanceMode::quantile || config.mode == MoeBalanceMode::sign_bias;
    // The config parser rejects all of these first (exit 2, naming the key); here they are the balancer's contract.
    MT_CHECK(num_experts >= 1 && top_k >= 1 && top_k <= num_experts,
             "moe: top_k = {} must be in [1, num_experts = {}]",
             top_k,
             num_experts);
    MT_CHECK(!uses_bias || num_experts > top_k,
             "moe.balance = \"{}\" needs num_experts > top_k (got {} and {})",
             enum_name(config.mode),
             num_experts,
             top_k);
    if (config.mode == MoeBalanceMode::quantile) {
        MT_CHECK(config.bins >= 1, "moe.quantile.bins = {} must be >= 1", config.bins);
        MT_CHECK(config.update_interval >= 1, "moe.quantile.update_interval = {} must be >= 1", config.update_interval);
        MT_CHECK(config.ema >= 0.0 && config.ema < 1.0, "moe.quantile.ema = {} must be in [0, 1)", config.ema);
        hist_.assign(static_cast<size_t>(n_ * config.bins), 0);
    }
    bias_.assign(static_cast<size_t>(n_), 0.0f);
    loads_.assign(static_cast<size_t>(n_), 0);
    snapshot_counts();
}

void MoeBalancer::set_bias(const std::vector<float>& bias) {
    MT_CHECK(
        static_cast<int64_t>(bias.size()) == n_, "moe balancer: bias has {} entries, expected {}", bias.size(), n_);
    bias_ = bias;
}

void MoeBalancer::observe(const Tensor& scores,
                          const Tensor& cutoff,
                          const Tensor& indices,
                          const MoeTokenGroup& group) {
    MT_CHECK(scores.ndim() == 2 && scores.size(1) == n_ && scores.is_contiguous(),
             "moe balancer: scores has shape {}, expected [N, {}]",
             core::shape_str(scores.shape()),
             n_);
    const int64_t n_tok = scores.size(0);
    MT_CHECK(indices.dtype() == DType::i32 && indices.shape() == core::Shape({n_tok, k_}),
             "moe balancer: indices has shape {}, expected [{}, {}] i32",
             core::shape_str(indices.shape()),
             n_tok,
             k_);
    const int64_t counted = group.ids.defined() ? group.tokens : n_tok;
    tokens_seen_ += counted;
    tokens_interval_ += counted;
    // Counted on the scores' device into pending buffers (ops/moe_balance.h), added to the host state when it is
    // read: the [N, n] scores of a GPU run never go to the host.
    const core::Device device = scores.device();
    if (loads_pending_.defined() && loads_pending_.device() != device) flush_pending();
    if (!loads_pending_.defined() || loads_pending_.device() != device)
        loads_pending_ = Tensor::zeros({n_}, DType::i64, device);
    ops::moe_expert_counts(indices, loads_pending_, group.ids, group.keep);
    counts_pending_ = true;
    if (config_.mode != MoeBalanceMode::quantile) return;
    MT_CHECK(cutoff.defined() && cutoff.shape() == core::Shape({n_tok}) && cutoff.dtype() == scores.dtype() &&
                 cutoff.device() == device,
             "moe balancer: quantile balancing needs the router's cutoff [{}] on the scores' device",
             n_tok);
    if (!hist_pending_.defined() || hist_pending_.device() != device)
        hist_pending_ = Tensor::zeros({n_, config_.bins}, DType::i64, device);
    ops::moe_qb_histogram(scores, cutoff, lower_, upper_, hist_pending_, group.ids, group.keep);
}

void MoeBalancer::flush_pending() const {
    if (!counts_pending_) return;
    counts_pending_ = false;
    if (loads_pending_.defined()) {
        const Tensor h = loads_pending_.to_device(core::Device::cpu);
        for (int64_t j = 0; j < n_; ++j) loads_[static_cast<size_t>(j)] += h.data<int64_t>()[j];
        loads_pending_.zero();
    }
    if (hist_pending_.defined()) {
        const Tensor h = hist_pending_.to_device(core::Device::cpu);
        const int64_t* v = h.data<int64_t>();
        for (size_t i = 0; i < hist_.size(); ++i) hist_[i] += static_cast<uint64_t>(v[i]);
        hist_pending_.zero();
    }
}

namespace {
// The balancer's counts as one i64 vector: [loads n | hist n B | tokens_seen | tokens_interval].
std::vector<int64_t> pack_counts(const std::vector<int64_t>& loads,
                                 const std::vector<uint64_t>& hist,
                                 int64_t tokens_seen,
                                 int64_t tokens_interval) {
    std::vector<int64_t> v(loads);
    for (uint64_t h : hist) v.push_back(static_cast<int64_t>(h));
    v.push_back(tokens_seen);
    v.push_back(tokens_interval);
    return v;
}
}  // namespace

void MoeBalancer::snapshot_counts() {
    counts_at_step_ = pack_counts(loads_, hist_, tokens_seen_, tokens_interval_);
}

void MoeBalancer::sum_step_counts(parallel::Comm& group) {
    flush_pending();
    if (group.size() == 1) return;
    // Every rank holds the same counts up to the last step (they were summed then), so only the increments since
    // are reduced: new = at_step + sum over ranks of (current - at_step).
    std::vector<int64_t> delta = pack_counts(loads_, hist_, tokens_seen_, tokens_interval_);
    MT_CHECK(delta.size() == counts_at_step_.size(), "moe balancer: count layout changed");
    for (size_t i = 0; i < delta.size(); ++i) delta[i] -= counts_at_step_[i];
    group.all_reduce(delta.data(), static_cast<int64_t>(delta.size()), parallel::CommType::i64, parallel::ReduceOp::sum)
        .wait();
    for (size_t i = 0; i < delta.size(); ++i) delta[i] += counts_at_step_[i];
    const size_t n = loads_.size(), nh = hist_.size();
    std::copy(delta.begin(), delta.begin() + static_cast<std::ptrdiff_t>(n), loads_.begin());
    for (size_t i = 0; i < nh; ++i) hist_[i] = static_cast<uint64_t>(delta[n + i]);
    tokens_seen_ = delta[n + nh];
    tokens_interval_ = delta[n + nh + 1];
}

void MoeBalancer::discard_step() {
    flush_pending();
    const size_t n = loads_.size(), nh = hist_.size();
    MT_CHECK(counts_at_step_.size() == n + nh + 2, "moe balancer: count layout changed");
    std::copy(counts_at_step_.begin(), counts_at_step_.begin() + static_cast<std::ptrdiff_t>(n), loads_.begin());
    for (size_t i = 0; i < nh; ++i) hist_[i] = static_cast<uint64_t>(counts_at_step_[n + i]);
    tokens_seen_ = counts_at_step_[n + nh];
    tokens_interval_ = counts_at_step_[n + nh + 1];
}

bool MoeBalancer::step() {
    const bool updated = step_update();
    snapshot_counts();
    return updated;
}

bool MoeBalancer::step_update() {
    flush_pending();
    switch (config_.mode) {
        case MoeBalanceMode::quantile:
            if (++steps_in_interval_ < config_.update_interval) return false;
            update_quantile();
            break;
        case MoeBalanceMode::sign_bias:
            update_sign();
            break;
        default:
            std::fill(loads_.begin(), loads_.end(), 0);
            tokens_interval_ = 0;
            return false;
    }
    steps_in_interval_ = 0;
    tokens_interval_ = 0;
    std::fill(loads_.begin(), loads_.end(), 0);
    ++updates_;
    return true;
}

namespace {

// b <- b - mean(b), rounded to f32; returns mean |b_new - b_old| against `old`.
double center_and_store(const std::vector<double>& b, const std::vector<float>& old, std::vector<float>* out) {
    const double mean = std::accumulate(b.begin(), b.end(), 0.0) / static_cast<double>(b.size());
    double moved = 0;
    for (size_t j = 0; j < b.size(); ++j) {
        (*out)[j] = static_cast<float>(b[j] - mean);
        moved += std::fabs(static_cast<double>((*out)[j]) - static_cast<double>(old[j]));
    }
    return moved / static_cast<double>(b.size());
}

}  // namespace

void MoeBalancer::update_quantile() {
    const int64_t bins = config_.bins;
    const double width = (upper_ - lower_) / static_cast<double>(bins);
    std::vector<double> b(static_cast<size_t>(n_));
    last_target_.assign(static_cast<size_t>(n_), 0.0);
    last_bin_count_.assign(static_cast<size_t>(n_), 0);
    for (int64_t j = 0; j < n_; ++j) {
        const uint64_t* h = hist_.data() + j * bins;
        const uint64_t total = std::accumulate(h, h + bins, uint64_t{0});
        double target = bias_[static_cast<size_t>(j)];
        if (total > 0) {
            const double tau = static_cast<double>(total) * static_cast<double>(k_) / static_cast<double>(n_);
            const uint64_t rank = static_cast<uint64_t>(std::ceil(tau));
            uint64_t cum = 0;
            int64_t c = 0;
            while (c < bins - 1 && cum + h[c] < rank) cum += h[c++];
            const double frac =
                h[c] > 0 ? std::clamp((tau - static_cast<double>(cum)) / static_cast<double>(h[c]), 0.0, 1.0) : 1.0;
            target = lower_ + (static_cast<double>(c) + frac) * width;
            last_bin_count_[static_cast<size_t>(j)] = h[c];
        }
        last_target_[static_cast<size_t>(j)] = target;
        const double ema = config_.ema;
        b[static_cast<size_t>(j)] = ema * static_cast<double>(bias_[static_cast<size_t>(j)]) + (1.0 - ema) * target;
    }
    const std::vector<float> old = bias_;
    last_bias_step_ = center_and_store(b, old, &bias_);
    const auto [mn, mx] = std::minmax_element(bias_.begin(), bias_.end());
    lower_ = static_cast<double>(*mn) - 1.0;
    upper_ = static_cast<double>(*mx) + 1.0;
    std::fill(hist_.begin(), hist_.end(), 0);
}

void MoeBalancer::update_sign() {
    const bool frozen = config_.sign_freeze_after_tokens >= 0 && tokens_seen_ >= config_.sign_freeze_after_tokens;
    const double gamma = frozen ? 0.0 : config_.sign_rate;
    const double mean_load = static_cast<double>(tokens_interval_ * k_) / static_cast<double>(n_);
    std::vector<double> sign(static_cast<size_t>(n_));
    for (int64_t j = 0; j < n_; ++j) {
        const double d = mean_load - static_cast<double>(loads_[static_cast<size_t>(j)]);
        sign[static_cast<size_t>(j)] = d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0);
    }
    const double mean_sign =
        config_.sign_centered ? std::accumulate(sign.begin(), sign.end(), 0.0) / static_cast<double>(n_) : 0.0;
    const std::vector<float> old = bias_;
    double moved = 0;
    for (int64_t j = 0; j < n_; ++j) {
        const size_t u = static_cast<size_t>(j);
        bias_[u] = static_cast<float>(static_cast<double>(bias_[u]) + gamma * (sign[u] - mean_sign));
        moved += std::fabs(static_cast<double>(bias_[u]) - static_cast<double>(old[u]));
    }
    last_bias_step_ = moved / static_cast<double>(n_);
}

std::vector<std::pair<std::string, Tensor>> MoeBalancer::state_tensors(const std::string& prefix) const {
    flush_pending();
    std::vector<std::pair<std::string, Tensor>> out;
    Tensor bias = Tensor::zeros({n_}, DType::f32);
    std::copy(bias_.begin(), bias_.end(), bias.data<float>());
    out.push_back({prefix + ".bias", bias});
    Tensor loads = Tensor::zeros({n_}, DType::i64);
    std::copy(loads_.begin(), loads_.end(), loads.data<int64_t>());
    out.push_back({prefix + ".loads", loads});
    Tensor counters = Tensor::zeros({4}, DType::i64);
    int64_t* c = counters.data<int64_t>();
    c[0] = steps_in_interval_, c[1] = updates_, c[2] = tokens_seen_, c[3] = tokens_interval_;
    out.push_back({prefix + ".counters", counters});
    if (config_.mode == MoeBalanceMode::quantile) {
        Tensor bounds = Tensor::zeros({2}, DType::f64);
        bounds.data<double>()[0] = lower_;
        bounds.data<double>()[1] = upper_;
        out.push_back({prefix + ".qb_bounds", bounds});
        Tensor hist = Tensor::zeros({n_, config_.bins}, DType::i64);
        for (size_t i = 0; i < hist_.size(); ++i) hist.data<int64_t>()[i] = static_cast<int64_t>(hist_[i]);
        out.push_back({prefix + ".qb_hist", hist});
    }
    return out;
}

void MoeBalancer::load_state(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& prefix) {
    auto find = [&](const std::string& suffix, const core::Shape& shape, DType dtype) {
        const std::string name = prefix + suffix;
        for (const auto& [key, t] : tensors) {
            if (key != name) continue;
            if (t.shape() != shape || t.dtype() != dtype)
                core::fail(ExitCode::checkpoint,
                           "checkpoint tensor {} has shape {} {}, expected {} {}",
                           name,
                           core::shape_str(t.shape()),
                           core::dtype_name(t.dtype()),
                           core::shape_str(shape),
                           core::dtype_name(dtype));
            return t.is_contiguous() ? t : t.clone();
        }
        core::fail(ExitCode::checkpoint, "checkpoint has no tensor {} (MoE balancer state)", name);
    };
    flush_pending();  // counts not yet flushed belong to the state being replaced
    const Tensor bias = find(".bias", {n_}, DType::f32), loads = find(".loads", {n_}, DType::i64);
    const Tensor counters = find(".counters", {4}, DType::i64);
    std::copy(bias.data<float>(), bias.data<float>() + n_, bias_.begin());
    std::copy(loads.data<int64_t>(), loads.data<int64_t>() + n_, loads_.begin());
    const int64_t* c = counters.data<int64_t>();
    steps_in_interval_ = c[0], updates_ = c[1], tokens_seen_ = c[2], tokens_interval_ = c[3];
    if (config_.mode == MoeBalanceMode::quantile) {
        const Tensor bounds = find(".qb_bounds", {2}, DType::f64),
                     hist = find(".qb_hist", {n_, config_.bins}, DType::i64);
        lower_ = bounds.data<double>()[0];
        upper_ = bounds.data<double>()[1];
        for (size_t i = 0; i < hist_.size(); ++i) hist_[i] = static_cast<uint64_t>(hist.data<int64_t>()[i]);
    }
    snapshot_counts();
}

nlohmann::json MoeBalancer::state_json() const {
    flush_pending();
    nlohmann::json j = {{"mode", enum_name(config_.mode)},
                        {"bias", bias_},
                        {"loads", loads_},
                        {"steps_in_interval", steps_in_interval_},
                        {"updates", updates_},
                        {"tokens_seen", tokens_seen_},
                        {"tokens_interval", tokens_interval_}};
    if (config_.mode == MoeBalanceMode::quantile) {
        j["lower"] = lower_;
        j["upper"] = upper_;
        j["bins"] = config_.bins;
        j["hist"] = hist_;
    }
    return j;
}

void MoeBalancer::load_state_json(const nlohmann::json& j) {
    flush_pending();  // counts not yet flushed belong to the state being replaced
    try {
        const std::string mode = j.at("mode").get<std::string>();
        if (mode != enum_name(config_.mode))
            core::fail(ExitCode::checkpoint,
                       "MoE balancer state is for moe.balance = \"{}\", the model uses \"{}\"",
                       mode,
                       enum_name(config_.mode));
        auto bias = j.at("bias").get<std::vector<float>>();
        auto loads = j.at("loads").get<std::vector<int64_t>>();
        if (static_cast<int64_t>(bias.size()) != n_ || static_cast<int64_t>(loads.size()) != n_)
            core::fail(ExitCode::checkpoint, "MoE balancer state has {} experts, the model {}", bias.size(), n_);
        if (config_.mode == MoeBalanceMode::quantile) {
            auto hist = j.at("hist").get<std::vector<uint64_t>>();
            if (hist.size() != hist_.size())
                core::fail(ExitCode::checkpoint,
                           "MoE balancer histogram has {} entries, expected {}",
                           hist.size(),
                           hist_.size());
            hist_ = std::move(hist);
            lower_ = j.at("lower").get<double>();
            upper_ = j.at("upper").get<double>();
        }
        bias_ = std::move(bias);
        loads_ = std::move(loads);
        steps_in_interval_ = j.at("steps_in_interval").get<int64_t>();
        updates_ = j.at("updates").get<int64_t>();
        tokens_seen_ = j.at("tokens_seen").get<int64_t>();
        tokens_interval_ = j.at("tokens_interval").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
        core::fail(ExitCode::checkpoint, "MoE balancer state JSON is malformed: {}", e.what());
    }
    snapshot_counts();
}

namespace {

template <typename T>
std::vector<double> qb_exact_bias(const T* s, const T* cutoff, int64_t n_tok, int64_t n, int64_t rank) {
    std::vector<double> b(static_cast<size_t>(n)), r(static_cast<size_t>(n_tok));
    for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < n_tok; ++i)
            r[static_cast<size_t>(i)] = static_cast<double>(cutoff[i]) - static_cast<double>(s[i * n + j]);
        std::nth_element(r.begin(), r.begin() + rank, r.end());
        const double above = r[static_cast<size_t>(rank)];
        const double below = *std::max_element(r.begin(), r.begin() + rank);
        b[static_cast<size_t>(j)] = 0.5 * (below + above);
    }
    return b;
}

}  // namespace

std::vector<double> moe_qb_exact_bias(const Tensor& scores, const Tensor& cutoff, int64_t top_k) {
    MT_CHECK(scores.ndim() == 2 && scores.is_contiguous() && cutoff.dtype() == scores.dtype() &&
                 cutoff.shape() == core::Shape({scores.size(0)}),
             "moe_qb_exact_bias: scores [N, n] and cutoff [N] must be contiguous and of one dtype");
    const int64_t n_tok = scores.size(0), n = scores.size(1);
    const int64_t rank = (n_tok * top_k + n - 1) / n;  // R = ceil(N k / n), 1-based
    MT_CHECK(rank >= 1 && rank < n_tok, "moe_qb_exact_bias: rank {} needs more than {} tokens", rank, n_tok);
    if (scores.dtype() == DType::f64)
        return qb_exact_bias(scores.data<double>(), cutoff.data<double>(), n_tok, n, rank);
    return qb_exact_bias(scores.data<float>(), cutoff.data<float>(), n_tok, n, rank);
}

}  // namespace mt::nn
