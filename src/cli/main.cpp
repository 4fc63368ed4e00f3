// moetrain command line: `moetrain train|data|inspect|grad-dump ...`. Every failure ends here with one
// message on stderr ("moetrain: error: ...", then a HINT line when there is one) and its exit code.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
    CLI::App app{"moetrain: trains Mixture-of-Experts, multimodal and long-context language models", "moetrain"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("moetrain ") + MT_VERSION);
    mt::cli::register_train(app);
    mt::cli::register_data(app);
    mt::cli::register_inspect(app);
    mt::cli::register_grad_dump(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        return code == 0 ? 0 : static_cast<int>(mt::core::ExitCode::usage);
    } catch (const mt::core::Error& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "moetrain: error: %s\n", e.what());
        if (!e.hint().empty()) std::fprintf(stderr, "  HINT: %s\n", e.hint().c_str());
        return static_cast<int>(e.code());
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "moetrain: error: internal: %s\n", e.what());
        return static_cast<int>(mt::core::ExitCode::internal);
    }
    return 0;
}
