// MPI start-up and shutdown, and the world communicator.
#include "parallel/runtime.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

namespace mt::parallel {

namespace {

bool g_started = false;  // this process called MPI_Init_thread
std::unique_ptr<Comm> g_world;

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
