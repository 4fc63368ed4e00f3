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

// Elastic resume: the launch's world and layout, the hosts and the probe (docs/operations.md "Elastic resume").
void elastic_setup(train::SuperviseOptions& o, const std::string& hosts) {
    const auto cfg = launch_config(o.command);
    if (!cfg)
        core::fail_hint(core::ExitCode::usage,
                        "launch `moetrain train --config FILE` under mpirun or srun",
                        "supervise --min-ranks: the launch command has no `moetrain train --config`");
    o.layout.world = train::launch_rank_count(o.command);
    if (o.layout.world <= 0)
        core::fail_hint(core::ExitCode::usage,
                        "launch the job with `mpirun -np N ...` or `srun -n N ...`",
                        "supervise --min-ranks: the launch command names no rank count");
    const auto& p = cfg->parallel;
    o.layout.model_size = p.tp * p.cp * p.pp;
    o.layout.ep = p.ep;
    o.layout.grad_accum = cfg->train.grad_accum;
    if (o.max_ranks == 0) o.max_ranks = o.layout.world;
    o.hosts = hosts.empty() ? std::vector<train::ElasticHost>{{.name = "localhost", .slots = o.layout.world}}
                            : train::elastic_parse_hosts(hosts);
    int64_t slots = 0;
    for (const auto& h : o.hosts) slots += h.slots;
    if (slots < o.layout.world)
        core::fail(core::ExitCode::usage,
                   "supervise --hosts: {} slots in all, fewer than the launch's {} ranks",
                   slots,
                   o.layout.world);
    if (o.probe.empty()) {
        const auto bin = std::find_if(o.command.begin(), o.command.end(), [](const std::string& a) {
            return a == "moetrain" || a.ends_with("/moetrain");
        });
        const std::string exe = bin != o.command.end() ? *bin : "moetrain";
        o.probe = fmt::format(
            "case {{host}} in localhost|127.0.0.1|$(hostname)) {} --version ;; *) ssh -o BatchMode=yes -o "
            "ConnectTimeout=5 {{host}} {} --version ;; esac",
            exe,
            exe);
    }
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
    auto hosts = std::make_shared<std::string>();
    cmd->add_option("--min-ranks",
                    o->min_ranks,
                    "elastic resume: after lost hosts, restart on the ranks left, down to this many (0: off)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--max-ranks", o->max_ranks, "elastic resume: never more ranks than this (0: the launch's)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--hosts",
                    *hosts,
                    "elastic resume: the hosts and their slots in rank order, NAME:SLOTS,... (default: one host, "
                    "localhost, with the launch's ranks)");
    cmd->add_option("--host-failures", o->host_failures, "failed probes in a row that drop a host")
        ->check(CLI::PositiveNumber);
    cmd->add_option(
           "--grow-after", o->grow_after_s, "seconds of good probes before a lost host is taken back (at a checkpoint)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--probe",
                    o->probe,
                    "the host probe, run by /bin/sh with {host} replaced (default: `<moetrain> --version` for "
                    "localhost, `ssh -o BatchMode=yes -o ConnectTimeout=5 {host} <moetrain> --version` otherwise)");
    cmd->add_option("command", o->command, "the launch command, after --")->required()->expected(-1);
    cmd->callback([o, on_stop, hang, grace, stop, hosts]() {
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
        if (o->min_ranks > 0) elastic_setup(*o, *hosts);
        const int code = train::supervise(*o);
        if (code != 0) throw ExitRequest{code};
    });
}

}  // namespace mt::cli
