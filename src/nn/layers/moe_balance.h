// MoE load balancing (moe.md §2): Quantile Balancing (histogram form, the default), DeepSeek-V3's sign-based bias,
// the classic auxiliary loss, or none. A MoeBalancer holds one MoE layer's state: the bias b [n] (f32, zero-mean;
// it shifts the top-k selection only), QB's bin bounds (L, U) and histogram H [n, B] (u64, accumulated over an
// update interval), the per-expert loads of the sign rule, and the counters. All of it round-trips through
// state_tensors() / load_state() (checkpoint tensors) and state_json() (the same, as JSON).
// observe() counts on the routing tensors' device (ops/moe_balance.h: the loads and QB's histogram, the bins
// computed in double on either device) into pending buffers; they are added to the host state, one copy back from a
// GPU, when the host state is read (step(), histogram(), state_tensors(), state_json()).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/moe_config.h"
#include "parallel/comm.h"

namespace mt::nn {

// The tokens of one group (a modality, multimodal.md §4) among a micro-batch's: ids [N] i32 on the routing device (one
// group per token), the group counted, and how many of the N tokens are in it (known on the host).
struct MoeTokenGroup {
    core::Tensor ids;
    int32_t keep = 0;
    int64_t tokens = 0;
};

class MoeBalancer {
   public:
    MoeBalancer() = default;
    // Contract (exit 1, MT_CHECK; the config parser rejects each first with exit 2): n > k with a bias method,
    // bins >= 1, interval >= 1, ema in [0, 1).
    MoeBalancer(int64_t num_experts, int64_t top_k, const MoeBalanceConfig& config);

    const MoeBalanceConfig& config() const {
        return config_;
    }
    // The selection bias (zero for aux_loss and none).
    const std::vector<float>& bias() const {
        return bias_;
    }
    void set_bias(const std::vector<float>& bias);  // tests and manual resets; kept as given
    // True when the router must report the cutoff (the (k+1)-th biased score) for observe().
    bool needs_cutoff() const {
        return config_.mode == MoeBalanceMode::quantile;
    }

    // Counts one micro-batch of training routing: scores [N, n] f32|f64 (cuda: bf16|f16|f32), cutoff [N] (quantile;
    // else undefined), indices [N, k] i32 (the router's pre-drop choice); all on one device. With group.ids defined
    // only that group's tokens count (moe.modality_bias = "balanced": one balancer per modality).
    void observe(const core::Tensor& scores,
                 const core::Tensor& cutoff,
                 const core::Tensor& indices,
                 const MoeTokenGroup& group = {});
    // Data and expert parallelism: adds the counts every rank of `group` observed since the last step() (loads, QB
    // histogram, token counters), so that all ranks hold the totals of the global batch and make the same update
    // (moe.md §3: histograms summed over the ranks that see different tokens). Collective over group.
    void sum_step_counts(parallel::Comm& group);
    // End of a training step (after the backward of its last micro-batch): QB updates b every update_interval-th
    // step; sign_bias every step. Returns true when b was updated.
    bool step();
    // A training step that is dropped (a skipped bad step, a re-run): forgets the counts observed since the last
    // step() or load, so that the balancer is as if the step's forwards never ran.
    void discard_step();
    // mean |b_new - b_old| of the last update (0 before any).
    double last_bias_step() const {
        return last_bias_step_;
    }
    int64_t updates() const {
        return updates_;
    }
    int64_t steps_in_interval() const {
        return steps_in_interval_;
    }
    // QB state (for tests and metrics).
    double lower() const {
        return lower_;
    }
    double upper() const {
        return upper_;
    }
    const std::vector<uint64_t>& histogram() const {
        flush_pending();
        return hist_;
    }  // [n, B] row-major
    // The last QB update's per-expert quantile b' (before the EMA and the centring), and the count of its bin
    // H[j][c*] (the histogram step's resolution, moe.md §6 test 5).
    const std::vector<double>& last_quantile_target() const {
        return last_target_;
    }
    const std::vector<uint64_t>& last_quantile_bin_count() const {
        return last_bin_count_;
    }

    // Checkpoint state as named tensors: {prefix}.bias f32 [n], {prefix}.qb_bounds f64 [2], {prefix}.qb_hist i64 [n, B]
    // (quantile only), {prefix}.loads i64 [n], {prefix}.counters i64 [4] (steps in interval, updates, tokens seen,
    // tokens in the current interval).
    std::vector<std::pair<std::string, core::Tensor>> state_tensors(const std::string& prefix) const;
    // Restores from tensors named as state_tensors writes them; fails (exit 4) naming a missing or mis-shaped tensor.
    void load_state(const std::vector<std::pair<std::string, core::Tensor>>& tensors, const std::string& prefix);
    nlohmann::json state_json() const;
    void load_state_json(const nlohmann::json& j);

   private:
    bool step_update();  // step() without the snapshot
    void update_quantile();
    void update_sign();
    // Adds the pending counts (if any) into hist_ and loads_ and zeroes them.
    void flush_pending() const;
    // Remembers the counts as they are after a step or a load: sum_step_counts reduces only what came after.
    void snapshot_counts();

    int64_t n_ = 0, k_ = 0;
    MoeBalanceConfig config_;
    std::vector<float> bias_;
    double lower_ = -1.0, upper_ = 1.0;
    mutable std::vector<uint64_t> hist_;  // [n, B]
    mutable std::vector<int64_t> loads_;  // [n], sign_bias: rows per expert since the last update
    mutable core::Tensor hist_pending_,
        loads_pending_;  // i64 [n, B], [n] on the scores' device: counts not yet in hist_, loads_
    mutable bool counts_pending_ = false;
    int64_t steps_in_interval_ = 0, updates_ = 0, tokens_seen_ = 0, tokens_interval_ = 0;
    double last_bias_step_ = 0.0;
    std::vector<int64_t> counts_at_step_;  // [loads n | hist n B | tokens_seen | tokens_interval] after the last step
    std::vector<double> last_target_;
    std::vector<uint64_t> last_bin_count_;
};

// QB's sort-based exact step (moe.md §6 test 5, the test oracle): with r_ij = cutoff_i - s_ij and R = ceil(N k / n),
// b'_j = the midpoint of the R-th and (R+1)-th smallest r_ij over i (not centred). scores [N, n], cutoff [N].
std::vector<double> moe_qb_exact_bias(const core::Tensor& scores, const core::Tensor& cutoff, int64_t top_k);

}  // namespace mt::nn
