// main() of mt_mpi_tests, the tests that run under `mpirun -np N` (CTest label mpi): starts MPI, runs every test on
// every rank (a failure on any rank fails mpirun), and lets only rank 0 print GoogleTest's progress. A run in which
// every case skipped (the GPU entries on a machine without enough GPUs) exits 77, CTest's SKIP_RETURN_CODE, so it
// reports Skipped rather than Passed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/blas_kernels.h"
#include "core/signals.h"
#include "parallel/runtime.h"

namespace {

constexpr int kSkipped = 77;

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);  // before MPI starts: it may re-execute the program
    ::testing::InitGoogleTest(&argc, argv);
    mt::parallel::dist_init(&argc, &argv);
    auto& world = mt::parallel::dist_world();
    mt::core::signals_install_fatal(world.rank());  // a crashing rank prints its rank and backtrace
    if (world.rank() != 0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
    }
    int rc = RUN_ALL_TESTS();
    const auto* unit = ::testing::UnitTest::GetInstance();
    // A filter that selects nothing (a misspelt suite in tests/CMakeLists.txt) would pass while checking nothing.
    if (unit->test_to_run_count() == 0 && !GTEST_FLAG_GET(list_tests)) {
        fmt::print(stderr, "mt_mpi_tests: the filter selected no test\n");
        rc = 1;
    }
    // Skipped only when this rank skipped something and neither passed nor failed anything (--gtest_list_tests
    // runs nothing and stays a success).
    const bool skipped_all =
        unit->skipped_test_count() > 0 && unit->successful_test_count() == 0 && unit->failed_test_count() == 0;
    // Decided together, so every rank exits with the same code: the worst result, and Skipped only when every rank
    // skipped everything (one rank that ran a case makes the job a pass or a failure).
    int worst[2] = {rc, skipped_all ? 0 : 1};
    if (world.size() > 1) world.all_reduce(worst, 2, mt::parallel::CommType::i32, mt::parallel::ReduceOp::max).wait();
    const int all = worst[0] != 0 ? worst[0] : (worst[1] == 0 ? kSkipped : 0);
    if (worst[0] != 0) fmt::print(stderr, "mt_mpi_tests: rank {} returns {}\n", world.rank(), rc);
    if (all == kSkipped && world.rank() == 0)
        fmt::print("mt_mpi_tests: every case skipped on every rank; exit {} (CTest: Skipped)\n", kSkipped);
    mt::parallel::dist_finalize();
    return all;
}
