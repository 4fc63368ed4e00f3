// Entry points of the Block AttnRes mix: argument checks and dispatch by device.
#include "ops/attnres_mix.h"

#include <fmt/format.h>

#include "ops/cpu/attnres_mix.h"
#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// Checks the sources (1..kAttnResMaxSources tensors of one shape [N, C] and one dtype) and returns {N, C}.
std::pair<int64_t, int64_t> check_sources(const std::vector<Tensor>& sources,
                                          std::string_view op,
                                          std::string_view arg) {
    MT_CHECK(!sources.empty() && static_cast<int64_t>(sources.size()) <= kAttnResMaxSources,
             "{}: {} holds {} tensors, expected 1 to {}",
             op,
             arg,
             sources.size(),
             kAttnResMaxSources);
    for (size_t j = 0; j < sources.size(); ++j) {
        const std::string name = fmt::format("{}[{}]", arg, j);
        check_arg(sources[j], op, name, 2);
        check_shape(sources[j], sources[0].shape(), op, name);
        check_same_dtype(sources[j], sources[0], op);
    }
    MT_CHECK(
        sources[0].size(1) > 0, "{}: {}[0] has shape {}; C must be > 0", op, arg, core::shape_str(sources[0].shape()));
    return {sources[0].size(0), sources[0].size(1)};
}

core::Device device_of(const std::vector<Tensor>& sources,
                       std::initializer_list<NamedArg> others,
                       std::string_view op) {
    const core::Device d = check_same_device(op, others);
    for (size_t j = 0; j < sources.size(); ++j)
        MT_CHECK(sources[j].device() == d,
                 "{}: source {} is on {} but the other arguments are on {}",
                 op,
                 j,
                 core::device_name(sources[j].device()),
                 core::device_name(d));
    return d;
}

}  // namespace

void attnres_mix_fwd(const std::vector<Tensor>& sources,
                     const Tensor& query,
                     const Tensor& key_gain,
                     double eps,
                     const Tensor& h,
                     const Tensor& alpha,
                     double blend) {
    constexpr std::string_view op = "attnres_mix_fwd";
    const auto [n, c] = check_sources(sources, op, "sources");
    const auto m = static_cast<int64_t>(sources.size());
    check_arg(query, op, "query", 1);
    check_arg(key_gain, op, "key_gain", 1);
    check_arg(h, op, "h", 2);
    check_arg(alpha, op, "alpha", 2);
    check_shape(query, {c}, op, "query");
    check_shape(key_gain, {c}, op, "key_gain");
    check_shape(h, {n, c}, op, "h");
    check_shape(alpha, {n, m}, op, "alpha");
    MT_CHECK(eps >= 0.0, "{}: eps = {} must be >= 0", op, eps);
    MT_CHECK(blend >= 0.0 && blend <= 1.0, "{}: blend = {} must be in [0, 1]", op, blend);
    const std::initializer_list<NamedArg> others = {
        {"query", query}, {"key_gain", key_gain}, {"h", h}, {"alpha", alpha}};
    MT_CALL_KERNEL(attnres_mix_fwd, device_of(sources, others, op), sources, query, key_gain, eps, h, alpha, blend);
}

void attnres_mix_bwd(const std::vector<Tensor>& sources,
                     const Tensor& query,
                     const Tensor& key_gain,
                     double eps,
                     const Tensor& alpha,
                     const Tensor& dh,
                     const std::vector<Tensor>& d_sources,
                     const Tensor& dquery,
                     const Tensor& dkey_gain,
                     double blend) {
    constexpr std::string_view op = "attnres_mix_bwd";
    const auto [n, c] = check_sources(sources, op, "sources");
    const auto m = static_cast<int64_t>(sources.size());
    check_sources(d_sources, op, "d_sources");
    MT_CHECK(static_cast<int64_t>(d_sources.size()) == m,
             "{}: d_sources holds {} tensors, expected {} (one per source)",
             op,
             d_sources.size(),
             m);
    check_shape(d_sources[0], {n, c}, op, "d_sources[0]");
    for (const auto& [t, name, shape] : {std::tuple{&query, "query", Shape{c}},
                                         std::tuple{&key_gain, "key_gain", Shape{c}},
                                         std::tuple{&alpha, "alpha", Shape{n, m}},
                                         std::tuple{&dh, "dh", Shape{n, c}},
                                         std::tuple{&dquery, "dquery", Shape{c}},
                                         std::tuple{&dkey_gain, "dkey_gain", Shape{c}}}) {
        check_arg(*t, op, name, static_cast<int>(shape.size()));
        check_shape(*t, shape, op, name);
    }
    MT_CHECK(eps >= 0.0, "{}: eps = {} must be >= 0", op, eps);
    MT_CHECK(blend >= 0.0 && blend <= 1.0, "{}: blend = {} must be in [0, 1]", op, blend);
    const std::initializer_list<NamedArg> others = {{"query", query},
                                                    {"key_gain", key_gain},
                                                    {"alpha", alpha},
                                                    {"dh", dh},
                                                    {"dquery", dquery},
                                                    {"dkey_gain", dkey_gain}};
    const core::Device dev = device_of(sources, others, op);
    for (size_t j = 0; j < d_sources.size(); ++j)
        MT_CHECK(d_sources[j].device() == dev, "{}: d_sources[{}] is not on {}", op, j, core::device_name(dev));
    // The CUDA backward loads every d_sources[j] of a step before storing any: two that share memory would lose one
    // accumulation. Checked on every device, so the CPU tests of the model would catch a caller that aliases them.
    for (size_t i = 0; i < d_sources.size(); ++i) {
        const auto* a = static_cast<const char*>(d_sources[i].raw());
        for (size_t j = i + 1; j < d_sources.size(); ++j) {
            const auto* b = static_cast<const char*>(d_sources[j].raw());
            MT_CHECK(a + d_sources[i].nbytes() <= b || b + d_sources[j].nbytes() <= a,
                     "{}: d_sources[{}] and d_sources[{}] share memory (each source needs its own gradient buffer)",
                     op,
                     i,
                     j);
        }
    }
    MT_CALL_KERNEL(attnres_mix_bwd, dev, sources, query, key_gain, eps, alpha, dh, d_sources, dquery, dkey_gain, blend);
}

}  // namespace mt::ops
