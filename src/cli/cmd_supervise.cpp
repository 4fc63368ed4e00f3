// `moetrain supervise [options] -- <launch command>` (operations.md §2, docs/operations.md): runs the launch
// (`moetrain train ...` or `mpirun ... moetrain train ...`) and restarts it from the newest checkpoint when it
// crashes or hangs (train/supervisor.h). The run directory is the launch's run.dir (its --config and --set), or
// --run-dir. Exits with the job's code: 0 when it completes.
#include <algorithm>
#include <optional>

#include "cli/commands.h"
#include "train/config.h"
#include "train/supervisor.h"

namespace mt::cli {

namespace {

// The job config of a `moetrain train` launch: its --config file with its --set overrides (none without --config).
std::optional<train::JobConfig> launch_config(const std::vector<std::string>& command) {
    std::string config;
    std::vector<std::string> overrides;
    // The options of a `train` subcommand only (`sh -c ...` has a -c of its own).
    const auto train = std::find(command.begin(), command.end(), "train");
    if (train == command.end()) return std::nullopt;
    for (auto i = static_cast<size_t>(train - command.begin()) + 1; i < command.size(); ++i) {
        const std::string& a = command[i];
        const bool next = i + 1 < command.size();
        if ((a == "--config" || a == "-c") && next) config = command[++i];
        if (a.rfind("--config=", 0) == 0) config = a.substr(9);
        if (a == "--set" && next) overrides.push_back(command[++i]);
        if (a.rfind("--set=", 0) == 0) overrides.push_back(a.substr(6));
    }
    if (config.empty()) return std::nullopt;
    return train::config_load(config, overrides);
}

}  // namespace

void register_supervise(CLI::App& app) {
    auto* cmd = app.add_subcommand("supervise", "run a training job and restart it when it crashes or hangs");
    auto o = std::make_shared<train::SuperviseOptions>();
    auto on_stop = std::make_shared<std::string>("exit");
    cmd->add_option("--run-dir", o->run_dir, "the job's run.dir (default: from the launch's --config and --set)");
    cmd->add_option("--max-restarts", o->max_restarts, "restarts allowed within --restart-window")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--restart-window", o->restart_window_s, "seconds over which --max-restarts counts")
        ->check(CLI::PositiveNumber);
    auto* hang = cmd->add_option("--hang-timeout",
                                 o->hang_timeout_s,
                                 "seconds without any rank's step advancing (x3 in a checkpoint or evaluation) before "
                                 "the job counts as hung (default: the launch config's health.hang_timeout_s)")
                     ->check(CLI::PositiveNumber);
    auto* grace = cmd->add_option("--kill-grace",
                                  o->kill_grace_s,
                                  "seconds between SIGTERM and SIGKILL when stopping a job (default: "
                                  "health.kill_grace_s)")
                      ->check(CLI::NonNegativeNumber);
    cmd->add_option("--backoff", o->backoff_s, "seconds before the first restart, doubled each time up to 60")
        ->check(CLI::NonNegativeNumber);
    auto* stop = cmd->add_option("--on-stop",
                                 *on_stop,
                                 "a health stop (exit 7): exit, or restart (default: "
                                 "health.on_stop)")
                     ->check(CLI::IsMember({"exit", "restart"}));
    cmd->add_option("command", o->command, "the launch command, after --")->required()->expected(-1);
    cmd->callback([o, on_stop, hang, grace, stop]() {
        // The launch's [health] settings, where the command line does not give them.
        if (const auto cfg = launch_config(o->command)) {
            if (o->run_dir.empty()) o->run_dir = cfg->run.dir;
            if (hang->count() == 0) o->hang_timeout_s = cfg->health.hang_timeout_s;
            if (grace->count() == 0) o->kill_grace_s = cfg->health.kill_grace_s;
            if (stop->count() == 0) *on_stop = cfg->health.on_stop;
        }
        o->restart_on_health_stop = *on_stop == "restart";
        if (o->run_dir.empty())
            core::fail_hint(core::ExitCode::usage,
                            "give --run-dir, or launch `moetrain train --config FILE`",
                            "supervise: no run directory: the launch command has no --config");
        const int code = train::supervise(*o);
        if (code != 0) throw ExitRequest{code};
    });
}

}  // namespace mt::cli
