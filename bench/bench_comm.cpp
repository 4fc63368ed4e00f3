// Bus bandwidth of the communicators under mpirun: all-reduce (sum, in place) and all-to-all (equal counts) of f32
// buffers, on the NCCL backend over GPU buffers and, as a second row, the MPI backend over host buffers. One JSON
// line per case, printed by rank 0.
//   mpirun -np N bench_comm [--sizes-mb 64,512] [--iters 20] [--warmup 5] [--mpi-iters 3] [--no-mpi]
// Conventions of nccl-tests (doc/PERFORMANCE.md there), so the figures compare with it and with
// tools/reference/bench_comm_torch.py: size is the bytes of one rank's buffer (the all-to-all's send buffer);
// time is host time from issuing the first of `iters` back-to-back operations to the completion of the last,
// divided by iters, after warm-up and a barrier, the slowest rank's; algbw = size / time; busbw = algbw * 2(n-1)/n
// for all-reduce and algbw * (n-1)/n for all-to-all (the fraction of the data that crosses links), in GB/s (1e9).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "core/blas_kernels.h"
#include "core/cuda_probe.h"
#include "core/tensor.h"
#include "parallel/comm_nccl.h"
#include "parallel/runtime.h"

namespace {

using mt::parallel::Comm;
using mt::parallel::CommType;
using mt::parallel::CommWork;
using mt::parallel::ReduceOp;

void print(const nlohmann::json& line) {
    if (mt::parallel::dist_world().rank() != 0) return;
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

// Seconds per operation: the slowest rank's mean over `iters` operations issued back to back.
double time_op(Comm& comm, const std::function<CommWork()>& issue, int warmup, int iters) {
    for (int i = 0; i < warmup; ++i) issue().wait();
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<CommWork> works;
    works.reserve(static_cast<size_t>(iters));
    for (int i = 0; i < iters; ++i) works.push_back(issue());
    for (auto& w : works) w.wait();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    double slowest = sec;
    mt::parallel::dist_world().all_reduce(&slowest, 1, CommType::f64, ReduceOp::max).wait();
    return slowest;
}

// Both cases at one size over `comm`; send and recv are buffers of `bytes` bytes on the backend's device.
void bench_size(Comm& comm, const char* impl, void* send, void* recv, int64_t bytes, int warmup, int iters) {
    const int n = comm.size();
    const int64_t count = bytes / 4;
    const double ar = time_op(
        comm, [&] { return comm.all_reduce(send, count, CommType::f32, ReduceOp::sum); }, warmup, iters);
    const std::vector<int64_t> counts(static_cast<size_t>(n), count / n);
    const double a2a = time_op(
        comm, [&] { return comm.all_to_all_v(send, counts, recv, counts, CommType::f32); }, warmup, iters);
    const double gb = static_cast<double>(bytes) / 1e9;
    for (const auto& [op, sec, factor] :
         {std::tuple{"all_reduce", ar, 2.0 * (n - 1) / n}, std::tuple{"all_to_all", a2a, 1.0 * (n - 1) / n}}) {
        print({{"bench", "comm"},
               {"impl", impl},
               {"op", op},
               {"dtype", "f32"},
               {"ranks", n},
               {"size_mb", bytes >> 20},
               {"bytes", bytes},
               {"time_ms", sec * 1e3},
               {"algbw_gbs", gb / sec},
               {"busbw_gbs", gb / sec * factor},
               {"iters", iters}});
    }
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain communicator bandwidth (run under mpirun)"};
    std::vector<int64_t> sizes_mb = {64, 512};
    int iters = 20, warmup = 5, mpi_iters = 3;
    bool no_mpi = false;
    app.add_option("--sizes-mb", sizes_mb, "buffer sizes per rank, MiB")->delimiter(',');
    app.add_option("--iters", iters, "timed operations per NCCL case");
    app.add_option("--warmup", warmup);
    app.add_option("--mpi-iters", mpi_iters, "timed operations per MPI case (one warm-up)");
    app.add_flag("--no-mpi", no_mpi, "skip the MPI rows");
    CLI11_PARSE(app, argc, argv);
    Comm& world = mt::parallel::dist_world();
    if (world.size() < 2) {
        print({{"bench", "comm"}, {"skipped", "run under mpirun -np 2 or more"}});
        return 0;
    }
    // The NCCL communicator first: it picks this rank's GPU, where every later allocation must live.
    if (!mt::parallel::comm_nccl_compiled() || mt::core::cuda_device_count() < world.size()) {
        print({{"bench", "comm"},
               {"impl", "moetrain-nccl"},
               {"skipped",
                mt::parallel::comm_nccl_compiled() ? "fewer GPUs than ranks" : "this build has no NCCL backend"}});
    } else {
        std::unique_ptr<Comm> nccl = mt::parallel::comm_make_nccl(world);
        for (int64_t mb : sizes_mb) {
            const int64_t bytes = mb << 20;
            const auto send = mt::core::Tensor::zeros({bytes / 4}, mt::core::DType::f32, mt::core::Device::cuda);
            const auto recv = mt::core::Tensor::zeros({bytes / 4}, mt::core::DType::f32, mt::core::Device::cuda);
            bench_size(*nccl, "moetrain-nccl", send.raw(), recv.raw(), bytes, warmup, iters);
        }
    }
    if (!no_mpi) {
        for (int64_t mb : sizes_mb) {
            const int64_t bytes = mb << 20;
            std::vector<float> send(static_cast<size_t>(bytes / 4), 1.0f), recv(send.size());
            bench_size(world, "moetrain-mpi", send.data(), recv.data(), bytes, 1, mpi_iters);
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    return mt::parallel::dist_run_main(argc, argv, "bench_comm", run);
}
