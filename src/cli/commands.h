// Each subcommand lives in its own file and registers itself on the CLI11 app. Callbacks report failure by
// throwing mt::core::Error; main() prints it and exits with its code. An outcome that is not a failure but has its
// own exit code (a graceful stop on SIGTERM) throws ExitRequest, which main() turns into that code silently.
#pragma once

#include <CLI/CLI.hpp>

namespace mt::cli {

struct ExitRequest {
    int code = 0;
};

void register_train(CLI::App& app);
void register_data(CLI::App& app);
void register_inspect(CLI::App& app);
void register_grad_dump(CLI::App& app);
void register_config(CLI::App& app);
void register_plan(CLI::App& app);
void register_supervise(CLI::App& app);
void register_dashboard(CLI::App& app);

}  // namespace mt::cli
