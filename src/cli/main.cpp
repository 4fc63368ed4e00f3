// moetrain command line: `moetrain train|data|inspect|grad-dump|config|plan|supervise|dashboard ...`. Every failure
// ends here with one message on stderr ("moetrain: error: ...", then a HINT line when there is one) and its exit code.
// Under mpirun the message is printed once: rank 0 prints at once; another rank waits a moment first, because an error
// that every rank hits together (a bad config, a non-finite loss) is printed by rank 0, whose MPI_Abort then ends the
// job; a rank whose error is its own prints it with its rank after the wait and ends the whole job (MPI_Abort with the
// same code), so no rank waits forever.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/blas_kernels.h"
#include "core/error.h"
#include "core/signals.h"
#include "parallel/runtime.h"

namespace {

// How long a rank other than 0 waits for rank 0 to end the job before printing its own error.
constexpr double kOtherRankGraceSeconds = 3.0;

void wait_for_rank0(int code) {
    for (double waited = 0.0; waited < kOtherRankGraceSeconds; waited += 0.05) {
        const timespec step{0, 50'000'000};
        nanosleep(&step, nullptr);
        // mpirun tears the job down with SIGTERM once rank 0 aborts: this rank's error was rank 0's too.
        if (mt::core::signals_stop_requested() != 0) _exit(code);
    }
}

int report(mt::core::ExitCode code, const char* message, const std::string& hint) {
    std::fflush(stdout);
    const mt::parallel::Comm& world = mt::parallel::dist_world();
    if (world.size() > 1 && world.rank() != 0) wait_for_rank0(static_cast<int>(code));
    const std::string rank = world.size() > 1 ? fmt::format("[rank {}] ", world.rank()) : "";
    std::fprintf(stderr, "moetrain: error: %s%s\n", rank.c_str(), message);
    if (!hint.empty()) std::fprintf(stderr, "  HINT: %s\n", hint.c_str());
    return static_cast<int>(code);
}

// failed: a failure (under MPI it ends every rank); otherwise every rank exits with `code` on its own.
int finish(int code, bool failed) {
    if (failed && code != 0 && mt::parallel::dist_world().size() > 1) mt::parallel::dist_abort(code);
    mt::parallel::dist_finalize();
    return code;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    CLI::App app{"moetrain: trains Mixture-of-Experts, multimodal and long-context language models", "moetrain"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("moetrain ") + MT_VERSION);
    mt::cli::register_train(app);
    mt::cli::register_data(app);
    mt::cli::register_inspect(app);
    mt::cli::register_grad_dump(app);
    mt::cli::register_config(app);
    mt::cli::register_plan(app);
    mt::cli::register_supervise(app);
    mt::cli::register_dashboard(app);
    int code = 0;
    bool failed = true;
    try {
        mt::parallel::dist_init(&argc, &argv);
        const mt::parallel::Comm& world = mt::parallel::dist_world();
        mt::core::signals_install_fatal(world.size() > 1 ? world.rank() : -1);
        app.parse(argc, argv);
        failed = false;
    } catch (const CLI::ParseError& e) {
        // --help and --version are "errors" of exit code 0, printed as CLI11 formats them.
        if (e.get_exit_code() == 0) {
            code = app.exit(e);
            failed = false;
        } else {
            code = report(mt::core::ExitCode::usage, e.what(), "run `moetrain --help` or `moetrain COMMAND --help`");
        }
    } catch (const mt::cli::ExitRequest& e) {
        code = e.code;
        failed = false;
    } catch (const mt::core::Error& e) {
        code = report(e.code(), e.what(), e.hint());
    } catch (const std::exception& e) {
        code = report(mt::core::ExitCode::internal, (std::string("internal: ") + e.what()).c_str(), "");
    }
    return finish(code, failed);
}
