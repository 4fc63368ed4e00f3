// main() of mt_mpi_tests, the tests that run under `mpirun -np N` (CTest label mpi): starts MPI, runs every test on
// every rank (a failure on any rank fails mpirun), and lets only rank 0 print GoogleTest's progress.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "dist/runtime.h"

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    mt::dist::dist_init(&argc, &argv);
    if (mt::dist::dist_world().rank() != 0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
    }
    const int rc = RUN_ALL_TESTS();
    // Every rank exits with the worst result, so a failure seen on one rank is the job's result.
    int all = rc;
    if (mt::dist::dist_world().size() > 1)
        mt::dist::dist_world().all_reduce(&all, 1, mt::dist::CommType::i32, mt::dist::ReduceOp::max).wait();
    if (all != 0) fmt::print(stderr, "mt_mpi_tests: rank {} returns {}\n", mt::dist::dist_world().rank(), rc);
    mt::dist::dist_finalize();
    return all;
}
