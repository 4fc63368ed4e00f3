// `moetrain config --docs`: prints the reference of every job-config key as Markdown, generated from the schema;
// docs/configs.md is its output (`moetrain config --docs > docs/configs.md`). `moetrain config --metrics --config
// FILE`: the metric registry of that job as Markdown (docs/metrics.md is the one of configs/kimi_linear_mini.toml).
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "train/config.h"
#include "train/metric_registry.h"

namespace mt::cli {

void register_config(CLI::App& app) {
    auto* cmd = app.add_subcommand("config", "describe the job config");
    auto docs = std::make_shared<bool>(false);
    auto metrics = std::make_shared<bool>(false);
    auto config = std::make_shared<std::string>();
    auto overrides = std::make_shared<std::vector<std::string>>();
    cmd->add_flag("--docs", *docs, "print the reference of every key as Markdown (docs/configs.md)");
    cmd->add_flag("--metrics",
                  *metrics,
                  "print the metric registry of the --config job as Markdown (docs/metrics.md: kimi_linear_mini)");
    cmd->add_option("--config,-c", *config, "the job config for --metrics");
    cmd->add_option("--set", *overrides, "override a value of --config: section.key=value (repeatable)");
    cmd->callback([docs, metrics, config, overrides]() {
        if (*docs == *metrics)
            core::fail_hint(core::ExitCode::usage,
                            "run `moetrain config --docs > docs/configs.md` or `moetrain config --metrics --config "
                            "configs/kimi_linear_mini.toml > docs/metrics.md`",
                            "moetrain config: pass one of --docs and --metrics");
        if (*metrics && config->empty())
            core::fail(core::ExitCode::usage, "moetrain config --metrics: no --config to describe");
        const std::string text =
            *docs ? train::config_docs() : train::metric_registry_markdown(train::config_load(*config, *overrides));
        std::fwrite(text.data(), 1, text.size(), stdout);
    });
}

}  // namespace mt::cli
