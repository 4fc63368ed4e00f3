// Helpers of the trainer tests under mpirun: directories every rank agrees on and the tiny job they train.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "parallel/runtime.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

namespace mt::testing {

// A run directory shared by all ranks (per test), emptied and created by rank 0 before any rank uses it.
inline std::string shared_dir(const std::string& name) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string dir = ::testing::TempDir() + "mt_mpi_" + info->name() + "_" + name;
    if (parallel::dist_world().rank() == 0) {
        std::filesystem::remove_all(dir);
        std::filesystem::create_directories(dir);
    }
    parallel::dist_world().barrier();
    return dir;
}

// Every rank writes the token data into its own directory (the same bytes everywhere).
inline std::string data_dir() {
    return fresh_dir("data_r" + std::to_string(parallel::dist_world().rank()));
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

// A small configs/shapes_tiny.toml (the MPI tests have no source dir to read it from): image + text rows of the
// generated shapes set (stage 1), a 2-layer LM of width 32 with tied embeddings, the test ViT of
// tiny_vision_overrides, one thread, 10 steps of batch 1 x 192 tokens, 4 eval batches, in run_dir; overrides last.
inline train::JobConfig mpi_shapes_job(const std::string& run_dir, std::vector<std::string> overrides) {
    const std::string toml = "[run]\ndir = \"" + run_dir +
                             "\"\nseed = 1234\ndevice = \"cpu\"\nthreads = 1\n"
                             "[model]\nvocab_size = 50\nd_model = 32\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\n"
                             "d_ff = 64\nmax_seq_len = 256\n"
                             "[vision]\nimage_token = 3\n"
                             "[data]\nformat = \"shapes\"\nshapes.stage = 1\neot_token = 1\n"
                             "[train]\nsteps = 10\nbatch_size = 1\nseq_len = 192\nlr = 3e-3\neval_every = 0\n"
                             "eval_batches = 4\n[checkpoint]\nevery_steps = 0\n";
    std::vector<std::string> o = tiny_vision_overrides();
    o.insert(o.end(), overrides.begin(), overrides.end());
    return train::config_parse(toml, run_dir + ".toml", o);
}

// The exact-resume check of the trainer tests: trains `cfg` (default world) for 8 steps with a checkpoint after
// step 4, then a new trainer of the same config loads it and must repeat steps 5-8 bitwise. Fills `out` with the
// checkpoint's manifest (the caller checks the mesh it records), its directory and the straight run's losses. Call
// it inside ASSERT_NO_FATAL_FAILURE.
struct ResumeRun {
    nlohmann::json manifest;
    std::vector<double> losses;
    std::string checkpoint;
};
inline void expect_exact_resume(const train::JobConfig& cfg, ResumeRun* out) {
    {
        train::Trainer t(cfg, false);
        for (int step = 1; step <= 8; ++step) {
            out->losses.push_back(t.train_step().loss);
            if (step == 4) t.save_checkpoint();
        }
    }
    out->checkpoint = cfg.run.dir + "/checkpoints/step_00000004";
    std::ifstream in(out->checkpoint + "/manifest.json");
    ASSERT_TRUE(in) << out->checkpoint;
    out->manifest = nlohmann::json::parse(in);
    train::Trainer resumed(cfg, false);
    resumed.load_checkpoint(out->checkpoint);
    ASSERT_EQ(resumed.step(), 4);
    for (int step = 5; step <= 8; ++step)
        EXPECT_EQ(resumed.train_step().loss, out->losses[size_t(step - 1)]) << "step " << step;
}

}  // namespace mt::testing
