// Helpers of the trainer tests under mpirun: directories every rank agrees on and the tiny job they train.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "dist/runtime.h"
#include "support/tiny_job.h"

namespace mt::testing {

// A run directory shared by all ranks (per test), emptied and created by rank 0 before any rank uses it.
inline std::string shared_dir(const std::string& name) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string dir = ::testing::TempDir() + "mt_mpi_" + info->name() + "_" + name;
    if (dist::dist_world().rank() == 0) {
        std::filesystem::remove_all(dir);
        std::filesystem::create_directories(dir);
    }
    dist::dist_world().barrier();
    return dir;
}

// Every rank writes the token data into its own directory (the same bytes everywhere).
inline std::string data_dir() {
    return fresh_dir("data_r" + std::to_string(dist::dist_world().rank()));
}

// tiny_job on the CPU with one thread per rank, 20 steps of batch 2, 4 validation batches, in run_dir.
inline train::JobConfig mpi_job(const std::string& data,
                                const std::string& run_dir,
                                std::vector<std::string> overrides) {
    overrides.insert(overrides.begin(),
                     {"run.threads=1",
                      "run.device=\"cpu\"",
                      "train.steps=20",
                      "train.batch_size=2",
                      "train.eval_batches=4",
                      "run.dir=\"" + run_dir + "\""});
    return tiny_job(data, overrides);
}

}  // namespace mt::testing
