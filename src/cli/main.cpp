// moetrain command line: `moetrain train|data|inspect|grad-dump ...`. Every failure ends here with one
// message on stderr ("moetrain: error: ...", then a HINT line when there is one) and its exit code. Under mpirun the
// failing rank prefixes its rank and ends the whole job (MPI_Abort with the same code), so no rank waits forever.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"
#include "parallel/runtime.h"

namespace {

int report(mt::core::ExitCode code, const char* message, const std::string& hint) {
    std::fflush(stdout);
    const mt::parallel::Comm& world = mt::parallel::dist_world();
    const std::string rank = world.size() > 1 ? fmt::format("[rank {}] ", world.rank()) : "";
    std::fprintf(stderr, "moetrain: error: %s%s\n", rank.c_str(), message);
    if (!hint.empty()) std::fprintf(stderr, "  HINT: %s\n", hint.c_str());
    return static_cast<int>(code);
}

int finish(int code) {
    if (code != 0 && mt::parallel::dist_world().size() > 1) mt::parallel::dist_abort(code);
    mt::parallel::dist_finalize();
    return code;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"moetrain: trains Mixture-of-Experts, multimodal and long-context language models", "moetrain"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("moetrain ") + MT_VERSION);
    mt::cli::register_train(app);
    mt::cli::register_data(app);
    mt::cli::register_inspect(app);
    mt::cli::register_grad_dump(app);
    int code = 0;
    try {
        mt::parallel::dist_init(&argc, &argv);
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        code = app.exit(e) == 0 ? 0 : static_cast<int>(mt::core::ExitCode::usage);
    } catch (const mt::core::Error& e) {
        code = report(e.code(), e.what(), e.hint());
    } catch (const std::exception& e) {
        code = report(mt::core::ExitCode::internal, (std::string("internal: ") + e.what()).c_str(), "");
    }
    return finish(code);
}
