// MPI start-up and shutdown, and the world communicator.
#include "parallel/runtime.h"

#include <execinfo.h>
#include <mpi.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace mt::parallel {

namespace {

bool g_started = false;  // this process called MPI_Init_thread
std::unique_ptr<Comm> g_world;
char g_signal_banner[64] = "moetrain: fatal signal; backtrace:\n";

// A crash of one rank otherwise shows only as mpirun's "exited on signal 11": print which rank and where (raw
// frames; `addr2line -Cfe BINARY +OFFSET` names them), then die of the same signal. Only async-signal-safe calls.
void on_fatal_signal(int sig) {
    ssize_t ignored = write(STDERR_FILENO, g_signal_banner, __builtin_strlen(g_signal_banner));
    void* frames[64];
    const int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    (void)ignored;
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

void install_fatal_signal_handlers(int rank) {
    std::snprintf(g_signal_banner, sizeof(g_signal_banner), "moetrain: rank %d: fatal signal; backtrace:\n", rank);
    void* warm[1];
    (void)backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, on_fatal_signal);
}

}  // namespace

int dist_local_size() {
    for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"}) {
        const char* value = std::getenv(var);
        if (value == nullptr) continue;
        const int n = std::atoi(value);
        if (n >= 1) return n;
    }
    return 1;
}

bool dist_launched_by_mpi() {
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
        if (std::getenv(var) != nullptr) return true;
    return false;
}

void dist_init(int* argc, char*** argv) {
    if (g_world) return;
    if (!dist_launched_by_mpi()) {
        g_world = comm_make_self();
        return;
    }
    int provided = 0;
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS)
        core::fail_hint(core::ExitCode::distributed,
                        "check that mpirun and the MPI library moetrain was built against are the same installation",
                        "MPI_Init_thread failed (error {})",
                        rc);
    g_started = true;
    if (provided < MPI_THREAD_FUNNELED)
        core::fail(core::ExitCode::distributed, "MPI provides thread level {}; moetrain needs FUNNELED", provided);
    g_world = comm_make_mpi_world();
    install_fatal_signal_handlers(g_world->rank());
}

void dist_finalize() {
    g_world.reset();
    if (!g_started) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
    g_started = false;
}

bool dist_mpi_active() {
    if (!g_started) return false;
    int finalized = 0;
    MPI_Finalized(&finalized);
    return finalized == 0;
}

Comm& dist_world() {
    if (!g_world) g_world = comm_make_self();
    return *g_world;
}

int dist_run_main(int argc, char** argv, const char* program, const std::function<int(int, char**)>& body) {
    dist_init(&argc, &argv);
    int rc = 0;
    try {
        rc = body(argc, argv);
    } catch (const core::Error& e) {
        std::fprintf(stderr, "%s: error: [rank %d] %s\n", program, dist_world().rank(), e.what());
        dist_abort(static_cast<int>(e.code()));
    }
    dist_finalize();
    return rc;
}

void dist_abort(int code) {
    std::fflush(stdout);
    std::fflush(stderr);
    if (dist_mpi_active() && g_world && g_world->size() > 1) MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
}

}  // namespace mt::parallel
