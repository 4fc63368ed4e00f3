// `moetrain config --docs`: prints the reference of every job-config key as Markdown, generated from the schema;
// docs/configs.md is its output (`moetrain config --docs > docs/configs.md`).
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "train/config.h"

namespace mt::cli {

void register_config(CLI::App& app) {
    auto* cmd = app.add_subcommand("config", "describe the job config");
    auto docs = std::make_shared<bool>(false);
    cmd->add_flag("--docs", *docs, "print the reference of every key as Markdown (docs/configs.md)");
    cmd->callback([docs]() {
        if (!*docs)
            core::fail_hint(core::ExitCode::usage,
                            "run `moetrain config --docs > docs/configs.md`",
                            "moetrain config: nothing to do; pass --docs");
        const std::string text = train::config_docs();
        std::fwrite(text.data(), 1, text.size(), stdout);
    });
}

}  // namespace mt::cli
