// MPI start-up and shutdown, and the world communicator.
#include "dist/runtime.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

namespace mt::dist {

namespace {

bool g_started = false;  // this process called MPI_Init_thread
std::unique_ptr<Comm> g_world;

}  // namespace

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

void dist_abort(int code) {
    std::fflush(stdout);
    std::fflush(stderr);
    if (dist_mpi_active() && g_world && g_world->size() > 1) MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
}

}  // namespace mt::dist
