// Prometheus text exposition 0.0.4: the strict parser of tests/support rejects broken input, and accepts the writer's
// output on hand-made lines (escaping, non-finite values, per-expert series) and on a tiny training run, whose
// metrics.prom and TensorBoard file follow the JSONL.
#include "train/prometheus.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_util.h"
#include "support/prometheus_parser.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

using mt::core::Error;
using mt::core::ExitCode;
using mt::testing::fresh_dir;
using mt::testing::prometheus_parse;
using mt::testing::PromExposition;
using mt::testing::PromSample;
using mt::train::MetricsLine;
using mt::train::PrometheusOptions;

namespace {

// The sample of family `name` whose labels include `labels`; fails the test when there is not exactly one.
PromSample sample(const PromExposition& e, const std::string& name, const std::map<std::string, std::string>& labels) {
    const auto* f = e.find(name);
    if (f == nullptr) {
        ADD_FAILURE() << "no family " << name;
        return {};
    }
    std::vector<PromSample> hits;
    for (const PromSample& s : f->samples) {
        bool match = true;
        for (const auto& [k, v] : labels) match = match && s.labels.count(k) && s.labels.at(k) == v;
        if (match) hits.push_back(s);
    }
    EXPECT_EQ(hits.size(), 1u) << name;
    return hits.empty() ? PromSample{} : hits[0];
}

}  // namespace

TEST(Prometheus, ParserAcceptsTheRules) {
    const std::string text =
        "# a comment\n"
        "# HELP x_total A \\\\ counter\\nwith two lines.\n"
        "# TYPE x_total counter\n"
        "x_total{a=\"q\\\"uote\\\\back\\nline\",b=\"\"} 1e3 1700000000000\n"
        "x_total 2\n"
        "\n"
        "# TYPE h histogram\n"
        "h_bucket{le=\"0.5\"} 1\n"
        "h_bucket{le=\"+Inf\"} 3\n"
        "h_sum .5\n"
        "h_count 3\n"
        "g NaN\n"
        "g2 -Inf\n";
    const PromExposition e = prometheus_parse(text);
    ASSERT_EQ(e.families.size(), 4u);
    const auto* x = e.find("x_total");
    ASSERT_NE(x, nullptr);
    EXPECT_EQ(x->help, "A \\ counter\nwith two lines.");
    EXPECT_EQ(x->type, "counter");
    ASSERT_EQ(x->samples.size(), 2u);
    EXPECT_EQ(x->samples[0].labels.at("a"), "q\"uote\\back\nline");
    EXPECT_EQ(x->samples[0].value, 1000.0);
    EXPECT_EQ(e.find("h")->samples.size(), 4u);
    EXPECT_TRUE(std::isnan(e.find("g")->samples[0].value));
    EXPECT_EQ(e.find("g2")->samples[0].value, -INFINITY);
}

TEST(Prometheus, ParserRejectsBrokenInput) {
    const std::vector<std::pair<std::string, std::string>> broken = {
        {"no final newline", "a 1"},
        {"bad metric name", "1a 1\n"},
        {"bad label name", "a{1b=\"x\"} 1\n"},
        {"unquoted label value", "a{b=x} 1\n"},
        {"bad escape in a label", "a{b=\"\\t\"} 1\n"},
        {"bad escape in HELP", "# HELP a tab\\t\na 1\n"},
        {"trailing comma", "a{b=\"x\",} 1\n"},
        {"duplicate label", "a{b=\"x\",b=\"y\"} 1\n"},
        {"bad value", "a 1.2.3\n"},
        {"lower-case inf", "a inf\n"},
        {"Inf without a sign", "a Inf\n"},
        {"no value", "a\n"},
        {"bad timestamp", "a 1 1.5\n"},
        {"extra field", "a 1 2 3\n"},
        {"TYPE twice", "# TYPE a gauge\n# TYPE a gauge\na 1\n"},
        {"HELP twice", "# HELP a x\n# HELP a y\na 1\n"},
        {"TYPE after the samples", "a 1\n# TYPE a gauge\n"},
        {"HELP after the samples", "a 1\n# HELP a x\n"},
        {"bad type", "# TYPE a number\na 1\n"},
        {"families interleaved", "a{x=\"1\"} 1\nb 1\na{x=\"2\"} 1\n"},
        {"duplicate series", "a{x=\"1\"} 1\na{x=\"1\"} 2\n"},
        {"counter without _total", "# TYPE a counter\na 1\n"},
        {"histogram without +Inf", "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n"},
        {"bucket without le", "# TYPE h histogram\nh_bucket 1\n"},
    };
    for (const auto& [what, text] : broken)
        EXPECT_THROW(prometheus_parse(text), std::runtime_error) << what << ": " << text;
}

TEST(Prometheus, KeysMapToFamiliesAndLabels) {
    using Labels = std::vector<std::pair<std::string, std::string>>;
    auto expect = [](const std::string& path, const std::string& family, const Labels& labels) {
        const auto s = mt::train::prometheus_series(path);
        EXPECT_EQ(s.family, family) << path;
        EXPECT_EQ(s.labels, labels) << path;
    };
    expect("train/loss", "moetrain_train_loss", {});
    expect("train/tokens_seen", "moetrain_tokens_total", {});
    expect("train/skipped_total", "moetrain_train_skipped_total", {});
    expect("eval/loss", "moetrain_eval_loss", {});
    expect("moe/max_vio/l03", "moetrain_moe_max_vio", {{"layer", "3"}});
    expect("moe/max_vio", "moetrain_moe_max_vio", {});
    expect("moe/load/l12", "moetrain_moe_load", {{"layer", "12"}});
    expect("long/kda_state_rms/l00", "moetrain_long_kda_state_rms", {{"layer", "0"}});
    expect("comm/dp/bytes", "moetrain_comm_bytes", {{"group", "dp"}});
    expect("comm/dp_grad_seconds", "moetrain_comm_dp_grad_seconds", {});
    expect("mem/peak_activations", "moetrain_mem_peak_activations", {});
    expect("pp/bubble", "moetrain_pp_bubble", {});
    expect("pp/wait_seconds/s1", "moetrain_pp_wait_seconds", {{"stage", "1"}});
    expect("moe/s1", "moetrain_moe_s1", {});
    expect("odd/key-with.dots", "moetrain_odd_key_with_dots", {});
}

// The exact text of a small case pins the layout: families in name order, HELP then TYPE, job first, '\n' after every
// line.
TEST(Prometheus, ExactTextOfASmallCase) {
    const std::string text = mt::train::prometheus_exposition(
        {{.kind = "train", .step = 2, .fields = {{"loss", 2.5}, {"tokens_seen", 4096}, {"moe/max_vio/l03", 0.125}}}},
        {.job = "run42"});
    EXPECT_EQ(text,
              "# HELP moetrain_moe_max_vio metrics.jsonl `train` lines, key moe/max_vio/l<NN>.\n"
              "# TYPE moetrain_moe_max_vio gauge\n"
              "moetrain_moe_max_vio{job=\"run42\",layer=\"3\"} 0.125\n"
              "# HELP moetrain_steps_total Optimizer steps done since the start of the run.\n"
              "# TYPE moetrain_steps_total counter\n"
              "moetrain_steps_total{job=\"run42\"} 2\n"
              "# HELP moetrain_tokens_total Tokens trained on since the start of the run.\n"
              "# TYPE moetrain_tokens_total counter\n"
              "moetrain_tokens_total{job=\"run42\"} 4096\n"
              "# HELP moetrain_train_loss Training loss (token mean) at the last logged step.\n"
              "# TYPE moetrain_train_loss gauge\n"
              "moetrain_train_loss{job=\"run42\"} 2.5\n");
}

TEST(Prometheus, EscapingNonFiniteAndPerExpert) {
    const std::vector<MetricsLine> lines = {
        {.kind = "train",
         .step = 5,
         .fields = {{"loss", std::nan("")},
                    {"grad_norm", INFINITY},
                    {"lr", -INFINITY},
                    {"skipped", true},
                    {"moe/collapse_alarms_total", 1},
                    {"moe/load/l01", {10, 0, 6}},
                    {"moe/imbalance_warning/l01", false},
                    {"comm/tp/calls", 12},
                    {"note", "strings are left out"}}},
        {.kind = "eval", .step = 4, .fields = {{"val_loss", 3.25}}},
    };
    const std::string job = "a \"quoted\" back\\slash\nnewline job";
    for (const bool per_expert : {false, true}) {
        const std::string text = mt::train::prometheus_exposition(lines, {.job = job, .per_expert = per_expert});
        SCOPED_TRACE(text);
        const PromExposition e = prometheus_parse(text);
        for (const auto& f : e.families) {
            EXPECT_TRUE(f.has_help && f.has_type) << f.name;
            EXPECT_EQ(f.name.substr(0, 9), "moetrain_");
            EXPECT_EQ(f.type, f.name.ends_with("_total") ? "counter" : "gauge") << f.name;
            for (const auto& s : f.samples) EXPECT_EQ(s.labels.at("job"), job);
        }
        EXPECT_TRUE(std::isnan(sample(e, "moetrain_train_loss", {}).value));
        EXPECT_EQ(sample(e, "moetrain_train_grad_norm", {}).value, INFINITY);
        EXPECT_EQ(sample(e, "moetrain_train_lr", {}).value, -INFINITY);
        EXPECT_NE(text.find("moetrain_train_loss{job=\"a \\\"quoted\\\" back\\\\slash\\nnewline job\"} NaN\n"),
                  std::string::npos);
        EXPECT_NE(text.find("} +Inf\n"), std::string::npos);
        EXPECT_EQ(sample(e, "moetrain_train_skipped", {}).value, 1.0);
        EXPECT_EQ(sample(e, "moetrain_moe_imbalance_warning", {{"layer", "1"}}).value, 0.0);
        EXPECT_EQ(e.find("moetrain_moe_collapse_alarms_total")->type, "counter");
        EXPECT_EQ(sample(e, "moetrain_comm_calls", {{"group", "tp"}}).value, 12.0);
        EXPECT_EQ(sample(e, "moetrain_steps_total", {}).value, 5.0);
        EXPECT_EQ(sample(e, "moetrain_eval_loss", {}).value, 3.25);
        EXPECT_EQ(sample(e, "moetrain_eval_step", {}).value, 4.0);
        EXPECT_EQ(e.find("moetrain_note"), nullptr);
        EXPECT_EQ(e.find("moetrain_train_note"), nullptr);
        if (!per_expert) {
            EXPECT_EQ(e.find("moetrain_moe_load"), nullptr);
            continue;
        }
        ASSERT_NE(e.find("moetrain_moe_load"), nullptr);
        EXPECT_EQ(e.find("moetrain_moe_load")->samples.size(), 3u);
        EXPECT_EQ(sample(e, "moetrain_moe_load", {{"layer", "1"}, {"expert", "2"}}).value, 6.0);
    }
    // HELP text escapes backslash and newline.
    EXPECT_EQ(mt::train::prometheus_escape_help("a\\b\nc\"d"), "a\\\\b\\nc\"d");
}

TEST(Prometheus, UnwritableFileIsOneIoError) {
    mt::train::PrometheusFile file("/nonexistent_dir_mt/metrics.prom", {.job = "x"});
    try {
        file.update({.kind = "train", .step = 1, .fields = {{"loss", 1.0}}});
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::io);
        EXPECT_NE(std::string(e.what()).find("/nonexistent_dir_mt/metrics.prom"), std::string::npos) << e.what();
    }
}

// A tiny MoE training with both views on: metrics.prom parses and holds the last train and eval line of the JSONL;
// the TensorBoard directory has one file; with the views off (the defaults) neither exists.
TEST(Prometheus, TinyTrainingWritesBothViews) {
    for (const bool on : {true, false}) {
        const std::string dir = fresh_dir(on ? "on" : "off");
        std::vector<std::string> o = {"run.device=\"cpu\"",
                                      "run.name=\"tiny \\\"views\\\"\"",
                                      "train.steps=3",
                                      "train.eval_every=3",
                                      "moe.enabled=true",
                                      "moe.num_experts=4",
                                      "moe.top_k=2",
                                      "moe.expert_ffn_dim=16",
                                      "moe.log_loads_every=1"};
        if (on)
            for (const char* key : {"metrics.tensorboard", "metrics.prometheus_file", "metrics.prometheus_per_expert"})
                o.push_back(std::string(key) + "=true");
        mt::train::Trainer trainer(mt::testing::tiny_job(dir, o), false);
        trainer.run();
        const std::string run = dir + "/run";
        EXPECT_EQ(std::filesystem::exists(run + "/metrics.prom"), on);
        EXPECT_EQ(std::filesystem::exists(run + "/tb"), on);
        if (!on) continue;
        EXPECT_EQ(std::distance(std::filesystem::directory_iterator(run + "/tb"), {}), 1);
        std::ifstream in(run + "/metrics.jsonl");
        nlohmann::json train, eval;
        for (std::string line; std::getline(in, line);) {
            const auto j = nlohmann::json::parse(line);
            if (j["kind"] == "train") train = j;
            if (j["kind"] == "eval") eval = j;
        }
        const std::string text = mt::core::read_file(run + "/metrics.prom");
        SCOPED_TRACE(text);
        const PromExposition e = prometheus_parse(text);
        EXPECT_EQ(sample(e, "moetrain_train_loss", {}).labels.at("job"), "tiny \"views\"");
        EXPECT_EQ(sample(e, "moetrain_train_loss", {}).value, train["loss"].get<double>());
        EXPECT_EQ(sample(e, "moetrain_steps_total", {}).value, 3.0);
        EXPECT_EQ(sample(e, "moetrain_tokens_total", {}).value, train["tokens_seen"].get<double>());
        EXPECT_EQ(sample(e, "moetrain_eval_loss", {}).value, eval["val_loss"].get<double>());
        EXPECT_EQ(sample(e, "moetrain_moe_max_vio", {{"layer", "1"}}).value, train["moe/max_vio/l01"].get<double>());
        EXPECT_EQ(sample(e, "moetrain_comm_bytes", {{"group", "dp"}}).value, 0.0);
        const auto& loads = train["moe/load/l01"];
        for (size_t x = 0; x < loads.size(); ++x)
            EXPECT_EQ(sample(e, "moetrain_moe_load", {{"layer", "1"}, {"expert", std::to_string(x)}}).value,
                      loads[x].get<double>());
        // Every numeric JSONL key of the last train line has its sample.
        size_t numeric = 0, samples = 0;
        for (const auto& [key, value] : train.items())
            numeric += (value.is_number() || value.is_boolean()) && key != "step" && key != "time";
        for (const auto& f : e.families)
            if (f.name != "moetrain_moe_load" && f.name != "moetrain_eval_loss" && f.name != "moetrain_eval_step")
                samples += f.samples.size();
        EXPECT_EQ(samples, numeric + 1) << "every numeric key and moetrain_steps_total";
    }
}
