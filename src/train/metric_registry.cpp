// The metric registry: see metric_registry.h. Each family is declared once here, with the condition under which the
// trainer writes it; the per-layer families are expanded over the layers they apply to.
#include "train/metric_registry.h"

#include <fmt/format.h>

#include <map>

#include "data/shapes_score.h"
#include "nn/layer_stats.h"
#include "nn/layers/moe_metrics.h"
#include "train/alarms.h"
#include "train/image_text_source.h"

namespace mt::train {

namespace {

constexpr const char* kCommGroups[] = {"tp", "cp", "ep", "dp", "pp", "world"};

struct Builder {
    std::vector<MetricDef> out;
    void add(std::string key, const char* type, const char* unit, std::string help, std::string when = "") {
        out.push_back({std::move(key), "train", type, unit, std::move(help), std::move(when)});
    }
};

std::string layer_key(const char* family, const char* stat, int64_t layer) {
    return fmt::format("{}/{}/l{:02d}", family, stat, layer);
}

}  // namespace

std::vector<MetricDef> metric_registry(const JobConfig& cfg) {
    const nn::ModelConfig& m = cfg.model;
    Builder b;
    // The step.
    b.add("loss", "gauge", "nats", "training loss: mean cross-entropy over the supervised tokens of the global batch");
    for (const DataSource& s : cfg.data_sources) {  // multimodal.md §8: per source, every step
        b.add("loss/" + s.name,
              "gauge",
              "nats",
              fmt::format("mean cross-entropy over the supervised tokens of source {}'s rows of the global batch, "
                          "C_i / N_i",
                          s.name),
              "data.sources (left out of a step without the source's tokens)");
        b.add("loss_weight/" + s.name,
              "gauge",
              "1",
              fmt::format(
                  "source {}'s weight under loss.weighting: 1 (token_mean), exp(-s_i) (uncertainty), w_i (gradnorm, "
                  "dwa)",
                  s.name),
              "data.sources");
    }
    b.add("lr", "gauge", "", "learning rate of the step");
    b.add("grad_norm", "gauge", "", "L2 norm of the whole reduced gradient, before clipping");
    b.add("tokens_per_s", "gauge", "tokens/s", "training tokens per second, mean over the steps after the first");
    b.add("step_seconds", "gauge", "s", "wall time of the step");
    b.add("tokens_seen", "counter", "tokens", "training tokens of the steps done");
    b.add("data_step", "gauge", "", "the data step the next step reads (its step, past the data bad steps dropped)");
    b.add("flops_per_s",
          "gauge",
          "FLOP/s",
          "model FLOPs per second of the step, all ranks together (docs/PERFORMANCE.md: the FLOPs per token of "
          "nn::Model::flops_per_token times the step's tokens)");
    b.add("mfu",
          "gauge",
          "1",
          "model FLOPs utilisation: flops_per_s over metrics.peak_tflops x the ranks",
          "metrics.peak_tflops > 0 (the default on a GPU: 989, dense bf16 of an H100/H200)");
    if (cfg.train.loss_scale == 0 && cfg.run.precision == "fp16") {
        const char* when = "dynamic loss scaling (fp16)";
        b.add("loss_scale", "gauge", "", "the loss scale the step's backward used", when);
        b.add("skipped", "gauge", "", "1 when an fp16 overflow skipped the step's update", when);
        b.add("skipped_total", "counter", "", "steps skipped by fp16 overflows", when);
    }
    if (m.moe_enabled && m.moe.balance.mode == nn::MoeBalanceMode::aux_loss)
        b.add("aux_loss", "gauge", "", "MoE auxiliary balancing loss (mean over micro-batches; not in loss)");
    // Memory.
    b.add("mem/allocated", "gauge", "bytes", "memory handed out at the step's end (the largest rank's)");
    b.add("mem/reserved", "gauge", "bytes", "memory held from the driver (or the process) at the step's end");
    b.add("mem/peak", "gauge", "bytes", "the most memory handed out at once during the step");
    b.add("mem/peak_activations", "gauge", "bytes", "mem/peak less the state (weights, gradients, moments)");
    // Communication.
    for (const char* g : kCommGroups) {
        b.add(fmt::format("comm/{}/bytes", g),
              "gauge",
              "bytes",
              fmt::format("bytes this rank sent over {} in the step", g));
        b.add(fmt::format("comm/{}/calls", g), "gauge", "", fmt::format("communication calls over {} in the step", g));
        b.add(fmt::format("comm/{}/seconds", g),
              "gauge",
              "s",
              fmt::format("host seconds inside {} calls and their waits in the step", g));
    }
    b.add("comm/dp_grad_seconds", "gauge", "s", "the gradient reduction's seconds not hidden behind the backward");
    b.add("comm/dp_buckets_overlapped", "gauge", "", "gradient buckets issued while the backward still ran");
    // The optimizer (muon.md §8).
    b.add("optim/clip_coef", "gauge", "", "the global-norm clip's coefficient (it scales the AdamW group only)");
    b.add("optim/step_seconds", "gauge", "s", "the optimizer update: both groups, and the start of ZeRO-1's gathers");
    if (cfg.optim.qk_clip)
        b.add("optim/qk_clipped_heads",
              "gauge",
              "",
              "query heads whose kv group QK-clip scaled this step (this rank's layers)",
              "optim.qk_clip");
    if (cfg.optim.name == "muon") {
        const char* when = "optim.name = \"muon\"";
        b.add("optim/muon_seconds", "gauge", "s", "Muon's step: momentum, Newton-Schulz and the update", when);
        b.add("optim/muon_overlapped_batches",
              "gauge",
              "",
              "Muon batches stepped inside the gradient reduction's wait, each as its bucket landed (data "
              "parallelism; 0: after the reduction)",
              when);
        b.add("optim/muon_clip_coef", "gauge", "", "muon.clip = \"own_norm\": the Muon group's own coefficient", when);
        b.add("optim/muon_grad_norm", "gauge", "", "the Muon group's gradient norm (reduced, unscaled)", when);
        b.add("optim/adamw_grad_norm", "gauge", "", "the AdamW group's gradient norm (reduced, unscaled)", when);
        b.add("optim/muon_update_rms", "gauge", "", "RMS of the Muon group's change (about scale_factor x lr)", when);
        for (const char* s : {"min", "mean", "max"})
            b.add(fmt::format("optim/muon_n_norm_{}", s),
                  "gauge",
                  "",
                  fmt::format("the {} of ||N||_F over the Muon matrices (near 1e-7 an update vanishes)", s),
                  when);
    }
    if (cfg.compress.level > 0) {
        const char* when = "compress.level > 0, after compress.warmup_steps";
        b.add("compress/ef_ratio", "gauge", "", "||e|| / ||g|| of the compressed leg (must stay bounded)", when);
        b.add("compress/error", "gauge", "", "||C(p) - p|| / ||p||: the compressor's relative error", when);
        b.add("compress/wire_bytes", "gauge", "bytes", "bytes the compressed reduce-to-owner sent (all ranks)", when);
        b.add("compress/raw_bytes", "gauge", "bytes", "the same exchange uncompressed (f32), all ranks", when);
    }
    if (cfg.parallel.pp > 1) {
        const char* when = "parallel.pp > 1";
        b.add("pp/bubble", "gauge", "1", "the pipeline schedule's ideal idle fraction", when);
        b.add("pp/wait_seconds", "gauge", "s", "this rank's seconds waiting for its neighbouring stages", when);
        b.add("pp/compute_seconds", "gauge", "s", "this rank's seconds running its chunks", when);
        for (int64_t s = 0; s < cfg.parallel.pp; ++s) {
            b.add(fmt::format("pp/wait_seconds/s{}", s), "gauge", "s", "stage s's wait seconds", when);
            b.add(fmt::format("pp/compute_seconds/s{}", s), "gauge", "s", "stage s's compute seconds", when);
            b.add(fmt::format("pp/mem_peak/s{}", s), "gauge", "bytes", "stage s's peak memory", when);
        }
    }
    // Health and alarms.
    if (cfg.health.spike_action != "off") {
        b.add("health/loss_z", "gauge", "", "robust z-score of the loss against the spike detector's window");
        b.add("health/grad_norm_z", "gauge", "", "robust z-score of the gradient norm against the window");
        for (const char* c :
             {"loss_spikes", "grad_spikes", "nonfinite", "transient_faults", "skipped_steps", "rollbacks"})
            b.add(fmt::format("health/{}_total", c), "counter", "", fmt::format("{} so far (docs/operations.md)", c));
    }
    for (const char* kind : kTrainerAlarmKinds)
        b.add(fmt::format("alarms/{}", kind), "counter", "", fmt::format("{} alarms raised so far", kind));
    // Long context.
    b.add("long/seq_len", "gauge", "tokens", "the row length of the step (the curriculum stage's)");
    b.add("long/segments", "gauge", "", "sequence segments of the last micro-batch (long.segments)");
    if (!cfg.long_ctx.stages.empty()) {
        const char* when = "a context-length curriculum ([[long.stages]])";
        b.add("long/stage", "gauge", "", "the curriculum stage of the step", when);
        b.add("long/long_share", "gauge", "1", "share of the step's tokens in long documents", when);
        b.add("long/stage_long_share", "gauge", "1", "the same over the stage so far", when);
        b.add(
            "long/stage_replay_share", "gauge", "1", "share of the stage's tokens that are replayed short data", when);
        b.add("long/stage_tokens", "counter", "tokens", "tokens the stage has trained on", when);
    }
    // MoE, model-wide.
    if (m.n_moe_layers() > 0) {
        b.add("moe/max_vio", "gauge", "1", "the worst MoE layer's MaxVio (max load / mean load - 1)");
        b.add("moe/load_var", "gauge", "1", "the largest per-layer load variance");
        b.add("moe/drop_rate", "gauge", "1", "mean share of routed rows dropped by the capacity");
        b.add("moe/collapse_alarms_total", "counter", "", "routing-collapse alarms so far");
    }
    // Per layer, in layer order.
    const std::map<std::string, std::pair<const char*, const char*>> moe_stats = {
        {"max_vio", {"1", "max load / mean load - 1"}},
        {"min_vio", {"1", "min load / mean load - 1"}},
        {"avg_vio", {"1", "mean |load / mean load - 1|"}},
        {"load_var", {"1", "variance of load / mean load"}},
        {"drop_rate", {"1", "share of routed rows dropped"}},
        {"bias_min", {"", "smallest selection bias"}},
        {"bias_max", {"", "largest selection bias"}},
        {"bias_range", {"", "bias_max - bias_min"}},
        {"bias_step", {"", "mean |bias change| of the last update"}},
        {"token_entropy", {"1", "mean routing entropy per token / ln E"}},
        {"load_entropy", {"1", "entropy of the load distribution / ln E"}},
        {"n_eff", {"", "effective number of experts, exp(load entropy)"}},
        {"aux_loss", {"", "the layer's auxiliary balancing loss"}},
        {"imbalance_warning", {"", "1 while load_var > 0.1"}},
        {"bias_range_warning", {"", "1 while bias_range > 1"}},
    };
    if (cfg.metrics.layer_stats && m.vision.enabled()) {
        for (const char* part : {"vision", "projector"}) {
            const std::string what = std::string(part) == "vision" ? "the vision encoder's" : "the projector's";
            b.add(fmt::format("{}/grad_norm", part),
                  "gauge",
                  "",
                  "L2 norm of " + what + " reduced gradient (before clipping, loss scale divided out)");
            b.add(fmt::format("{}/param_norm", part), "gauge", "", "L2 norm of " + what + " weights after the update");
            b.add(fmt::format("{}/update_ratio", part),
                  "gauge",
                  "1",
                  "L2 norm of the change the optimizer step applied to " + what + " weights / its param_norm");
        }
        b.add("vision/image_token_share", "gauge", "1", "image slots / all tokens of the step's training batches");
        b.add("vision/projector_rms", "gauge", "", "RMS of the projector's outputs (the image embeddings)");
        b.add("vision/text_embed_rms",
              "gauge",
              "",
              "RMS of the token embeddings of every other row: far from projector_rms, one modality drowns the other");
    }
    for (int64_t l = 0; l < m.n_layers; ++l) {
        if (cfg.metrics.layer_stats) {
            b.add(fmt::format("layer/{}/grad_norm", l),
                  "gauge",
                  "",
                  "L2 norm of the layer's reduced gradient (before clipping, loss scale divided out)");
            b.add(
                fmt::format("layer/{}/param_norm", l), "gauge", "", "L2 norm of the layer's weights after the update");
            b.add(fmt::format("layer/{}/update_norm", l),
                  "gauge",
                  "",
                  "L2 norm of the change the optimizer step applied to the layer's weights (0 on a skipped step)");
            b.add(fmt::format("layer/{}/update_ratio", l), "gauge", "1", "update_norm / param_norm");
            b.add(fmt::format("layer/{}/act_rms", l),
                  "gauge",
                  "",
                  m.attnres.enabled() ? "RMS of the AttnRes mix after the layer (the next layer's input, or the final "
                                        "mix) over the step's training tokens"
                                      : "RMS of the residual stream after the layer over the step's training tokens");
            if (m.layer_is_kda(l)) {
                b.add(fmt::format("layer/{}/kda_gate_mean", l),
                      "gauge",
                      "",
                      "mean log decay g of the KDA gate over tokens, heads and key channels (the memory: about -1 / "
                      "mean tokens)");
                b.add(fmt::format("layer/{}/kda_gate_sat", l),
                      "gauge",
                      "1",
                      m.kda.gate == ops::KdaGateKind::softplus
                          ? "share of gate values g <= -5 (decay below e^-5 per token)"
                          : "share of gate values within 1% of kda.gate_lower_bound (saturated: g <= 0.99 l)");
            }
        }
        if (m.layer_is_kda(l)) {
            b.add(layer_key("long", "kda_state_rms", l), "gauge", "", "RMS of the KDA layer's final state");
        } else {
            b.add(layer_key("long", "max_logit", l), "gauge", "", "largest pre-softmax logit of the layer");
        }
        if (!m.layer_is_moe(l)) continue;
        for (const auto& [stat, d] : moe_stats) b.add(layer_key("moe", stat.c_str(), l), "gauge", d.first, d.second);
        b.add(layer_key("moe", "load", l),
              "array",
              "rows",
              "routed rows per expert of the step",
              "every moe.log_loads_every steps");
        if (!cfg.data.images()) continue;
        // Image + text batches: per modality, on that modality's rows against its own mean T_m k / n, and the
        // experts' image shares (multimodal.md §4).
        for (const char* name : nn::kMoeModalityNames) {
            auto key = [&](const char* stat) { return fmt::format("moe/modality/{}/{}/l{:02d}", name, stat, l); };
            b.add(key("token_share"), "gauge", "1", fmt::format("share of the step's tokens that are {} tokens", name));
            b.add(key("max_vio"), "gauge", "1", fmt::format("max load / mean load - 1 over the {} tokens' rows", name));
            b.add(key("load_var"),
                  "gauge",
                  "1",
                  fmt::format("variance of load / mean load over the {} tokens' rows", name));
            if (m.moe.capacity_factor > 0)
                b.add(key("drop_rate"),
                      "gauge",
                      "1",
                      fmt::format("share of the {} tokens' routed rows dropped by the capacity", name),
                      "moe.capacity_factor > 0");
            b.add(key("load"),
                  "array",
                  "rows",
                  fmt::format("routed rows of the {} tokens per expert", name),
                  "every moe.log_loads_every steps");
        }
        b.add(
            layer_key("moe", "image_share", l), "gauge", "1", "share of the step's tokens that are image tokens (phi)");
        for (const char* q : nn::kExpertImageShareStats)
            b.add(layer_key("moe", fmt::format("expert_image_share_{}", q).c_str(), l),
                  "gauge",
                  "1",
                  fmt::format("the {} over the experts with rows of their image share phi_j (image rows / rows; "
                              "against image_share: expert specialisation)",
                              q));
    }
    // Block AttnRes, per mix l = 0..2 n_layers (sub-layer l's input; the last is the final mix).
    if (m.attnres.enabled() && cfg.metrics.layer_stats) {
        const nn::LayerStatsLayout layout = nn::layer_stats_layout(m);
        for (size_t l = 0; l < layout.mix_sources.size(); ++l) {
            for (int64_t k = 0; k < layout.mix_sources[l]; ++k)
                b.add(fmt::format("attnres/{}/w{}", l, k),
                      "gauge",
                      "1",
                      "mean softmax weight alpha of the mix's source k (0: the embedding, then the blocks in order)");
            b.add(fmt::format("attnres/{}/entropy", l),
                  "gauge",
                  "1",
                  "mean entropy of the mix's alpha / ln(sources) (1 uniform, 0 a single source)");
        }
    }
    std::vector<MetricDef> out = std::move(b.out);
    out.push_back({"val_loss", "eval", "gauge", "nats", "validation loss (mean over train.eval_batches)", ""});
    for (const DataSource& s : cfg.data_sources)
        out.push_back({"eval/" + s.name + "/loss",
                       "eval",
                       "gauge",
                       "nats",
                       fmt::format("validation loss of source {} alone (val_loss: the sources' mean weighted by their "
                                   "shares)",
                                   s.name),
                       "data.sources"});
    if (cfg.data.format == "shapes" && cfg.data_sources.empty()) {
        out.push_back({"eval/blind_bound",
                       "eval",
                       "gauge",
                       "nats",
                       "the best loss without the images on the val batches (exact, multimodal.md §6): below it, the "
                       "pixels reach the loss",
                       ""});
        out.push_back({"eval/bound_ratio", "eval", "gauge", "1", "val_loss / eval/blind_bound", ""});
        out.push_back({"eval/exact_match",
                       "eval",
                       "gauge",
                       "1",
                       "share of val samples whose greedy caption is exact (every supervised argmax is its target)",
                       ""});
        for (const ShapesControl c : shapes_controls_run(cfg)) {
            const std::string name = nn::enum_name(c);
            const std::string what = c == ShapesControl::comp_val ? "the comp-val split (held-out color-shape pairs)"
                                                                  : "the val batches in the " + name + " view";
            out.push_back({"eval/" + name + "/loss", "eval", "gauge", "nats", "validation loss on " + what, ""});
            out.push_back({"eval/" + name + "/exact_match", "eval", "gauge", "1", "greedy exact match on " + what, ""});
            if (c != ShapesControl::comp_val) {
                out.push_back({"eval/" + name + "/bound_ratio",
                               "eval",
                               "gauge",
                               "1",
                               "eval/" + name + "/loss over its own exact blind bound",
                               ""});
                continue;
            }
            for (const char* attribute : data::kShapesAttributeNames)
                out.push_back({fmt::format("eval/comp_val/acc_{}", attribute),
                               "eval",
                               "gauge",
                               "1",
                               fmt::format("comp-val accuracy of the {} tokens (teacher-forced argmax)", attribute),
                               ""});
        }
    }
    return out;
}

std::string metric_registry_markdown(const JobConfig& cfg) {
    const std::vector<MetricDef> defs = metric_registry(cfg);
    std::string md = fmt::format(
        "# Metrics\n\n"
        "Generated by `moetrain config --metrics --config {}` from the metric registry "
        "(`src/train/metric_registry.cpp`); do not edit by hand. Every key below is what a `train` or `eval` line of "
        "metrics.jsonl carries for this job (conventions §7.1); TensorBoard tags and Prometheus families are named "
        "from them (docs/operations.md \"Metrics views\"). Per-layer keys are listed for each layer they apply to.\n\n"
        "**{} metrics** for `{}` ({} layers, pattern `{}`, {} MoE layers).\n\n"
        "| key | line | type | unit | meaning | written |\n| --- | --- | --- | --- | --- | --- |\n",
        cfg.source,
        defs.size(),
        cfg.run.name,
        cfg.model.n_layers,
        cfg.model.layer_pattern,
        cfg.model.n_moe_layers());
    for (const MetricDef& d : defs)
        md += fmt::format("| `{}` | {} | {} | {} | {} | {} |\n",
                          d.key,
                          d.line,
                          d.type,
                          d.unit,
                          d.help,
                          d.when.empty() ? "every `metrics.every` steps" : d.when);
    return md;
}

}  // namespace mt::train
