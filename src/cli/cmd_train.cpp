// `moetrain train --config FILE [--set section.key=value ...] [--resume]`
#include "cli/commands.h"
#include "train/trainer.h"

namespace mt::cli {

void register_train(CLI::App& app) {
    auto* cmd = app.add_subcommand("train", "train a model from a TOML job config");
    struct Options {
        std::string config;
        std::vector<std::string> overrides;
        bool resume = false;
        std::string resume_from;
        std::string device;
    };
    auto opts = std::make_shared<Options>();
    cmd->add_option("-c,--config", opts->config, "job config (TOML)")->required();
    cmd->add_option("--set", opts->overrides, "override a config value: section.key=value (repeatable)");
    cmd->add_option("--device",
                    opts->device,
                    "cpu, cuda or auto (overrides run.device; auto picks cuda when a GPU is "
                    "visible)");
    cmd->add_flag("--resume", opts->resume, "continue from the newest complete checkpoint under run.dir");
    cmd->add_option("--resume-from", opts->resume_from, "continue from this checkpoint directory");
    cmd->callback([opts]() {
        if (!opts->device.empty()) opts->overrides.push_back("run.device=\"" + opts->device + "\"");
        train::Trainer trainer(train::config_load(opts->config, opts->overrides));
        if (!opts->resume_from.empty()) {
            trainer.load_checkpoint(opts->resume_from);
        } else if (opts->resume && !trainer.resume_latest()) {
            fmt::print("moetrain: no complete checkpoint under {}/checkpoints; starting from step 0\n",
                       trainer.config().run.dir);
        }
        trainer.run();
    });
}

}  // namespace mt::cli
