// `moetrain train --config FILE [--set section.key=value ...] [--resume | --resume-from DIR]`. World rank 0 holds
// run.dir's lock (train/run_lock.h) from before anything is read or written there until the process ends; SIGTERM
// and SIGINT stop the run gracefully after a checkpoint, with exit code 8 (docs/training.md).
#include "cli/commands.h"
#include "core/signals.h"
#include "parallel/runtime.h"
#include "train/config_parallel.h"
#include "train/run_lock.h"
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
    auto* resume =
        cmd->add_flag("--resume", opts->resume, "continue from the newest complete checkpoint under run.dir");
    cmd->add_option("--resume-from", opts->resume_from, "continue from this checkpoint directory")->excludes(resume);
    cmd->callback([opts]() {
        const parallel::Comm& world = parallel::dist_world();
        // From here on a signal only asks for a stop; rank 0 (or the only process) acknowledges it.
        core::signals_install_stop(world.rank() == 0);
        if (!opts->device.empty()) opts->overrides.push_back("run.device=\"" + opts->device + "\"");
        train::JobConfig cfg = train::config_load(opts->config, opts->overrides);
        // A layout that does not fit the job's processes exits 2 before run.dir is touched (the trainer resolves it
        // again; this call only checks).
        (void)train::config_mesh_shape(cfg, world.size());
        // The other ranks of the job share rank 0's lock; they never touch the lock file.
        train::RunLock lock;
        if (world.rank() == 0) lock = train::RunLock(cfg.run.dir, cfg.source);
        train::Trainer trainer(std::move(cfg));
        if (!opts->resume_from.empty()) {
            trainer.load_checkpoint(opts->resume_from);
        } else if (opts->resume && !trainer.resume_latest()) {
            fmt::print("moetrain: no complete checkpoint under {}/checkpoints; starting from step 0\n",
                       trainer.config().run.dir);
        }
        if (trainer.run() == train::RunEnd::stopped) throw ExitRequest{static_cast<int>(core::ExitCode::stopped)};
    });
}

}  // namespace mt::cli
