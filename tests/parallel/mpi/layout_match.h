// The layout-equality check of the parallel trainer tests (tensor, pipeline and context parallelism): a layout trains
// side by side with one process running the same global batch, and the loss and gradient norm of every step, the MoE
// routing counts and QB biases, the final parameters and the validation loss must agree within 1e-5 (relative, f32).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "parallel/mpi/mpi_job.h"
#include "parallel/runtime.h"
#include "train/trainer.h"

namespace mt::testing {

using parallel::comm_make_self;
using parallel::CommType;
using parallel::dist_world;
using parallel::ReduceOp;

// A layout of the mesh and its pipeline schedule.
struct Layout {
    int tp = 1, dp = 1;
    bool sp = true;  // parallel.sequence_parallel (with tp > 1)
    int ep = 1, pp = 1, virtual_stages = 1;
    int cp = 1;  // parallel.cp: the cp ranks share each data rank's rows
};

// The relative difference ||a - b|| / ||a|| of the parameters this rank holds (its shards' real parts, all tensors
// as one vector) against the same boxes of the one-process run's. (Per tensor it would be ill-conditioned for the
// tensors that start at zero, such as KDA's A_log under the bounded gate.)
inline double worst_param_difference(train::Trainer& single, train::Trainer& par) {
    const mt::nn::ParamTable& a = single.model().params();
    const mt::nn::ParamTable& b = par.model().params();
    double diff_sq = 0.0, norm_sq = 0.0;
    for (int i = 0; i < b.size(); ++i) {
        const mt::nn::ParamSpec& spec = b.spec(i);
        const int j = a.find(spec.name);
        EXPECT_GE(j, 0) << spec.name;
        if (j < 0) continue;
        const mt::nn::ParamBox box = mt::nn::param_box(spec);
        mt::core::Tensor whole = a.master(j), part = b.master(i);
        for (size_t d = 0; d < box.offset.size(); ++d) {
            whole = whole.slice(static_cast<int>(d), box.offset[d], box.offset[d] + box.extent[d]);
            part = part.slice(static_cast<int>(d), 0, box.extent[d]);
        }
        const mt::core::Tensor x = whole.clone(), y = part.clone();
        double diff = 0.0, norm = 0.0;
        for (int64_t k = 0; k < x.numel(); ++k) {
            const double u = mt::core::tensor_get_flat(x, k), v = mt::core::tensor_get_flat(y, k);
            diff += (u - v) * (u - v);
            norm += u * u;
        }
        diff_sq += diff, norm_sq += norm;
    }
    return std::sqrt(diff_sq / norm_sq);
}

// The job of a run directory with the given overrides (both runs of a layout check); empty: mpi_job on the tiny token
// data.
using LayoutJob = std::function<train::JobConfig(const std::string& run_dir, const std::vector<std::string>& keys)>;

// Trains the one-process run and the layout side by side for `steps` steps; expects equal losses, gradient norms
// and final parameters (param_tol > 0: the parameters within it for any layout, data parallelism alone included).
inline void expect_layout_matches(const std::string& name,
                                  const Layout& l,
                                  std::vector<std::string> model,
                                  int steps,
                                  double param_tol = 0.0,
                                  LayoutJob job = {}) {
    const int n = dist_world().size();
    // Micro-batches per rank (the interleaved schedule needs a multiple of the stages), and the ranks that read
    // different batches.
    const int64_t ga = l.virtual_stages > 1 ? std::max(2, l.pp) : 2, data = l.dp * l.ep;
    const std::string dir = shared_dir(name);
    if (!job)
        job = [data_path = data_dir()](const std::string& run_dir, const std::vector<std::string>& keys) {
            return mpi_job(data_path, run_dir, keys);
        };
    auto self = comm_make_self();
    std::vector<std::string> one = model, par = model;
    one.insert(one.end(), {"train.grad_accum=" + std::to_string(ga * data), "parallel.dp=1"});
    par.insert(par.end(),
               {"train.grad_accum=" + std::to_string(ga),
                "parallel.tp=" + std::to_string(l.tp),
                "parallel.dp=" + std::to_string(l.dp),
                "parallel.ep=" + std::to_string(l.ep),
                "parallel.pp=" + std::to_string(l.pp),
                "parallel.cp=" + std::to_string(l.cp),
                "pp.virtual_stages=" + std::to_string(l.virtual_stages),
                std::string("pp.schedule=") + (l.virtual_stages > 1 ? "\"interleaved\"" : "\"1f1b\""),
                std::string("parallel.sequence_parallel=") + (l.sp ? "true" : "false"),
                "train.steps=" + std::to_string(steps)});
    one.push_back("train.steps=" + std::to_string(steps));
    train::Trainer single(job(dir + "/single", one), false, self.get());
    train::Trainer tp(job(dir + "/par", par), false);
    ASSERT_EQ(tp.tokens_per_step(), single.tokens_per_step());
    ASSERT_EQ(tp.data_size(), n / (l.tp * l.pp * l.cp));
    double worst_loss = 0.0, worst_norm = 0.0;
    for (int step = 1; step <= steps; ++step) {
        const auto a = single.train_step();
        const auto b = tp.train_step();
        const double dl = std::abs(a.loss - b.loss) / std::abs(a.loss);
        const double dn = std::abs(a.grad_norm - b.grad_norm) / std::abs(a.grad_norm);
        worst_loss = std::max(worst_loss, dl), worst_norm = std::max(worst_norm, dn);
        EXPECT_LT(dl, 1e-5) << name << " step " << step << ": " << a.loss << " vs " << b.loss;
        EXPECT_LT(dn, 1e-5) << name << " step " << step << " grad norm " << a.grad_norm << " vs " << b.grad_norm;
        // MoE: every rank of the stage routes its own rows; the counts summed over them are one process's.
        // (Under pipeline parallelism a rank reports its own stage's MoE layers.)
        for (const auto& [layer, metrics] : b.moe)
            for (const auto& [layer_one, metrics_one] : a.moe)
                if (layer == layer_one) {
                    EXPECT_EQ(metrics.tokens, metrics_one.tokens) << name << " step " << step;
                }
    }
    for (auto& [layer, layer_moe] : tp.model().moe_layers())
        for (auto& [layer_one, one_moe] : single.model().moe_layers()) {
            if (layer != layer_one) continue;
            const std::vector<float> ba = one_moe->balancer().bias(), bb = layer_moe->balancer().bias();
            double worst_bias = 0.0;
            for (size_t j = 0; j < ba.size(); ++j) worst_bias = std::max(worst_bias, double(std::abs(ba[j] - bb[j])));
            EXPECT_LT(worst_bias, 1e-4) << name << " QB biases of layer " << layer;
        }
    double params = worst_param_difference(single, tp);  // each rank's own; the largest over the ranks is printed
    double largest = params;
    dist_world().all_reduce(&largest, 1, CommType::f64, ReduceOp::max).wait();
    // The control (data parallelism alone) only reports: plain data parallelism over four ranks drifts to 9e-6 over
    // these 20 steps (Adam at lr 1e-2 magnifies the summation-order differences), the reference the tp layouts are read
    // against.
    if (param_tol > 0.0 || l.tp * l.pp * l.cp > 1) {
        EXPECT_LT(params, param_tol > 0.0 ? param_tol : 1e-5) << name << " final parameters";
    }
    const double va = single.evaluate(), vb = tp.evaluate();
    EXPECT_LT(std::abs(va - vb) / va, 1e-5) << name << " val " << va << " vs " << vb;
    if (dist_world().rank() == 0)
        fmt::print(
            "{} vs one process, {} steps: max relative difference loss {:.2e}, grad norm {:.2e}, parameters "
            "{:.2e} (largest over the ranks)\n",
            name,
            steps,
            worst_loss,
            worst_norm,
            largest);
}

inline std::string layout_name(const char* model, const Layout& l) {
    return fmt::format("{}_tp{}_cp{}_ep{}_dp{}_pp{}v{}_{}",
                       model,
                       l.tp,
                       l.cp,
                       l.ep,
                       l.dp,
                       l.pp,
                       l.virtual_stages,
                       l.sp ? "sp" : "nosp");
}

}  // namespace mt::testing
