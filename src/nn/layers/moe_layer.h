// Mixture-of-Experts FFN layer (moe.md §1): a sigmoid (or softmax) router picks top_k of num_experts routed SwiGLU
// experts per token on score + bias, gates come from the unbiased scores; num_shared_experts shared experts (fused
// into one SwiGLU FFN of width expert_ffn_dim * num_shared_experts) see every token:
//   y_i = FFN_shared(x_i) + sum_{j in I_i} g_ij FFN_j(x_i)
// Tokens are permuted by expert (ops/moe_permute.h), the experts run as grouped GEMMs (ops/grouped_linear.h), and
// the combine weights the rows by their gates (ops/moe_unpermute.h). Optional capacity dropping (off by default).
// Balancing (nn/layers/moe_balance.h) and metrics with the collapse alarm (nn/layers/moe_metrics.h) are per layer.
// Precision: the routing tensors (scores, gates, cutoff, bias, the gate gradients) are in precision.stats (f32 under
// CUDA mixed precision, spec: the router in fp32); logits, expert activations and their gradients in
// precision.compute. On CUDA the plan runs on the device and its offsets are copied back once per forward (the
// grouped GEMMs' shapes; the backward reuses them); the routing counts for the balancer and the metrics stay on the
// device until step_end.
//
// Parameters under the prefix (e.g. "layers.3.moe"):
//   {prefix}.router.weight              [E, C]
//   {prefix}.experts.w_gate, .w_up      [E, F, C]   (stacked [out, in] per expert)
//   {prefix}.experts.w_down             [E, C, F]
//   {prefix}.shared.w_gate.weight, .w_up.weight [F * n_s, C], .w_down.weight [C, F * n_s]   (when n_s > 0)
//   {prefix}.router.modality_bias       [kMoeModalities, E]   (moe.modality_bias = "learned": c_m, init 0)
// The balancing bias is not a parameter: it is balancer state (balancer().state_tensors("{prefix}.router")).
// Image + text models (vision enabled, or moe.modality_bias set) take the tokens' modality before every forward
// (set_modality): the step's metrics then hold per-modality loads, balance and the experts' image shares, the collapse
// detector also runs on each modality's own rows, and moe.modality_bias routes by it (multimodal.md §4): "balanced"
// keeps one balancer per modality (the image one's state under "{prefix}.router.image"), a token of modality m
// selecting on s + b_m; "learned" adds c_m to the router logits.
// Expert parallelism (MoeExpertParallel::size > 1): the expert tensors hold this rank's E / ep experts (expert-sharded
// parameters), the router and the shared experts stay replicated; routed rows travel to their experts' ranks and
// back by all-to-all (nn/layers/moe_dispatch.h), in the forward and again (the gradients) in the backward.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/layer.h"
#include "nn/layers/linear.h"
#include "nn/layers/mlp.h"
#include "nn/layers/moe_balance.h"
#include "nn/layers/moe_dispatch.h"
#include "nn/layers/moe_metrics.h"
#include "nn/model_config.h"
#include "nn/moe_config.h"
#include "nn/workspace.h"
#include "ops/moe_permute.h"
#include "ops/moe_router.h"

namespace mt::parallel {
class Comm;
}

namespace mt::nn {

// Expert parallelism (runtime state the trainer takes from the mesh; not a config key): this rank holds experts
// [rank E / size, (rank + 1) E / size) and exchanges routed rows with the other ranks of the ep group by
// all-to-all: the row counts over `comm` (host memory, MPI), the rows over `rows_comm` (the activations' memory:
// the same MPI communicator on the CPU, NCCL on the GPU; nullptr means `comm`). size 1 (the default) keeps every
// expert local and never communicates.
struct MoeExpertParallel {
    int64_t size = 1;
    int64_t rank = 0;
    parallel::Comm* comm = nullptr;
    parallel::Comm* rows_comm = nullptr;
};

// The modality of every token of the next forwards (multimodal.md §3): 0 text, 1 image. ids on the routing device
// (the model's), host its copy on the host (the same tensor on the CPU); both [N] i32, kept until replaced.
struct MoeModality {
    Tensor ids;
    Tensor host;
};

class MoeLayer : public Layer {
   public:
    // Declares the parameters. Contract (exit 1, MT_CHECK, as every layer's; the config parser rejects each first with
    // exit 2, naming the key): num_experts in [1, 1024], top_k in [1, num_experts], the balancer's (moe_balance.h).
    // ep: this rank's share of the experts and the communicators of the ep group (the default: every expert here).
    // tp: under tensor parallelism each tp rank routes its own token rows (the tp ranks are folded into ep by the
    // caller), so the router's gradient is a part per rank; the block then holds the shared experts itself, split
    // over tp like a dense MLP, and `moe` comes without them.
    MoeLayer(ParamTable& table,
             const std::string& prefix,
             const ModelConfig& model,
             const MoeConfig& moe,
             const MoeExpertParallel& ep = {},
             const TensorParallel& tp = {});

    void resize(int64_t n, const Precision& precision);
    // Whether the layer takes token modalities (the model's config has a vision encoder or moe.modality_bias), and
    // the modalities of the next forwards and their backwards (required then; [N] as the next forward's rows).
    bool per_modality() const {
        return per_modality_;
    }
    void set_modality(const MoeModality& modality);
    // x: [N, C] (the normed residual) -> out: [N, C]. training: count the routing for the balancer and the step's
    // metrics (never during a recompute). With aux_loss balancing, aux_loss() is then this forward's loss.
    void forward(const Tensor& x, const Tensor& out, bool training = true);
    // dout: [N, C] -> dx: [N, C] written (=); parameter grads accumulate. Adds the aux loss's gradient (weight 1)
    // when aux_loss balancing is on. Scratch from ws's slots 0-6 (see reserve_scratch's table in moe_layer.cpp).
    void backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws);
    // Sizes the workspace slots backward takes (after resize), so that none grows during training (under expert
    // parallelism the expert rows may still grow a slot).
    void reserve_scratch(Workspace& ws) const;
    // End of a training step: the balancer's update, the step's metrics (from the routing counted since the last
    // call), and the collapse detector. The alarm, if one fires at this step, is in last_alarm(). data_group: the
    // ranks that routed different tokens (data and expert parallelism); their counts are summed first, so every
    // rank makes the same update and the same alarm decision. Collective over it when it has more than one rank.
    MoeStepMetrics step_end(int64_t step, parallel::Comm* data_group = nullptr);
    // A training step that is dropped instead (a skipped bad step, a re-run): its routing counts are forgotten, the
    // balancer and the detector stay as they were. Local: every rank drops the same step.
    void discard_step();
    const std::optional<MoeCollapseEvent>& last_alarm() const {
        return last_alarm_;
    }
    // The per-modality collapse alarms that fired at the last step_end (each with its modality named).
    const std::vector<MoeCollapseEvent>& last_modality_alarms() const {
        return last_modality_alarms_;
    }

    double aux_loss() const {
        return aux_loss_;
    }
    // The multiplier of the aux loss's gradient in the next backward: the model passes its backward's loss scale
    // (which includes 1 / grad_accum), so that the aux loss is averaged over micro-batches like the LM loss.
    void set_aux_grad_scale(double scale) {
        aux_grad_scale_ = scale;
    }
    // The routing of the last forward: indices [N, K] i32, gates [N, K], scores [N, E]; rows kept.
    Tensor indices() const {
        return indices_;
    }
    Tensor gates() const {
        return gates_;
    }
    Tensor scores() const {
        return scores_;
    }
    int64_t rows_kept() const {
        return rows_;
    }
    // The layer's non-parameter state for a checkpoint: the balancer's tensors under "{prefix}.router" (bias, loads,
    // counters, QB bounds and histogram; with "balanced" the image balancer's under "{prefix}.router.image"), and the
    // balancer and collapse-detector state as JSON (the manifest's form).
    std::vector<std::pair<std::string, Tensor>> state_tensors() const;
    void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors);
    nlohmann::json state_json() const;
    void load_state_json(const nlohmann::json& j);
    // The balancer (modality 0's, the text one, under "balanced"), or modality m's.
    MoeBalancer& balancer(int64_t modality = 0) {
        return balancers_.at(static_cast<size_t>(modality));
    }
    int64_t num_balancers() const {
        return static_cast<int64_t>(balancers_.size());
    }
    MoeCollapseDetector& collapse_detector() {
        return detector_;
    }
    // The per-modality collapse detectors' state (per_modality() layers; an empty array otherwise), for checkpoints.
    nlohmann::json modality_alarm_state_json() const;
    void load_modality_alarm_state_json(const nlohmann::json& j);
    const MoeConfig& config() const {
        return moe_;
    }
    std::vector<SavedTensor> saved_for_backward() override;

   private:
    // The step's per-modality totals reset (after step_end or a discarded step).
    void reset_modality_step();
    // The rows of the last forward that the capacity kept, per modality (capacity dropping with modalities).
    void count_modality_drops();
    // Expert parallelism: grows the expert-side buffers to hold `rows`.
    void reserve_expert_rows(int64_t rows);
    // Which expert GEMMs run on the device grouped GEMM under this precision (moe.grouped_gemm), for n tokens.
    struct DeviceGemm {
        bool fwd = false, dx = false, dw = false;  // the forward's products, the backward's dx and dw
        bool any() const {
            return fwd || dx || dw;
        }
        bool all() const {
            return fwd && dx && dw;
        }
    };
    DeviceGemm use_device_gemm(const Precision& precision, int64_t n) const;
    // The ops' choice for one direction: the device kernel (auto, or device where the config demands it) or cuBLASLt.
    ops::GroupedGemm gemm_impl(bool device) const;
    // The buffers recompute moe_act / moe_permute / moe_experts drop, from the current ones (after every
    // reallocation).
    void list_dropped();
    // One expert product's backward, dx and dw on the implementations device_gemm_ picked (one call where they agree).
    void expert_gemm_bwd(const Tensor& x, int w, const Tensor& dy, const Tensor& dx, bool accumulate_dx);
    // The routed experts' SwiGLU FFN over the gathered rows xe into ye, and (expert parallelism) ye back to the
    // rows' sources yp: the forward's, and the backward's again under recompute moe_experts.
    void experts_forward(const Tensor& xe, const Tensor& ye, const Tensor& yp);

    std::string prefix_;
    ModelConfig model_;
    MoeConfig moe_;
    MoeExpertParallel ep_;
    ops::MoeRouterOptions router_options_;
    ParamTable* table_ = nullptr;
    Linear router_;
    int w_gate_ = -1, w_up_ = -1, w_down_ = -1;
    std::unique_ptr<Mlp> shared_;
    std::vector<MoeBalancer> balancers_;  // one, or one per modality ("balanced")
    MoeCollapseDetector detector_;
    std::optional<MoeCollapseEvent> last_alarm_;
    // Token modalities (per_modality_): the next forwards', the tokens of each, the step's per-modality totals
    // (loads [M, E] on the routing device until step_end, then on the host) and each modality's detector.
    bool per_modality_ = false;
    MoeModality modality_;
    std::array<int64_t, kMoeModalities> modality_tokens_ = {};
    int learned_bias_ = -1;  // moe.modality_bias = "learned": the parameter c [M, E]
    Tensor step_modality_load_acc_;
    std::vector<int64_t> step_modality_load_;  // [M E]
    std::array<int64_t, kMoeModalities> step_modality_tokens_ = {}, step_modality_dropped_ = {};
    std::vector<MoeCollapseDetector> modality_detectors_;
    std::vector<MoeCollapseEvent> last_modality_alarms_;
    int64_t n_ = -1, rows_ = 0;
    double aux_loss_ = 0.0;
    double aux_grad_scale_ = 1.0;
    // The step's routing totals (training forwards since the last step_end).
    std::vector<int64_t> step_load_;
    int64_t step_tokens_ = 0, step_dropped_ = 0;
    double step_entropy_ = 0.0, step_aux_ = 0.0;
    // Saved activations (R <= N * K rows are used of the [N * K, *] buffers).
    Tensor logits_, scores_, indices_, gates_, cutoff_, bias_;  // [N, E], [N, E], [N, K], [N, K], [N], [E] or [M, E]
    Tensor offsets_, slot_row_, row_token_;                     // [E + 1], [N, K], [N * K] i32
    Tensor offsets_host_;  // [E + 1] i32 on the host (CUDA: copied back unless the device grouped GEMM needs no copy)
    // The grouped GEMMs' offsets as each implementation reads them: on the device (offsets_; under expert
    // parallelism the local experts' [E / ep + 1] copied into local_offsets_) and on the host (offsets_host_, or the
    // dispatch plan's local offsets). expert_offsets(device) picks one for a product (device_gemm_).
    Tensor expert_offsets_device_, expert_offsets_host_, local_offsets_;
    const Tensor& expert_offsets(bool device) const {
        return device ? expert_offsets_device_ : expert_offsets_host_;
    }
    DeviceGemm device_gemm_;                   // which expert GEMMs take the device kernel (use_device_gemm)
    int64_t expert_rows_ = 0;                  // rows the local experts process (rows_ without expert parallelism)
    std::vector<float> bias_uploaded_;         // the bias last copied into bias_ ([E], or [M, E] under "balanced")
    Tensor step_load_acc_, step_entropy_acc_;  // i64 [E], f64 [1] on the routing device, summed until step_end
    Tensor xp_, hg_, hu_, act_, yp_;           // [N K, C], [N K, F] x3, [N K, C]
    // Expert parallelism: the rows this rank's experts received, their outputs, and the grow-only capacity of the
    // expert-side buffers (hg_, hu_, act_ and their gradients hold expert rows then).
    MoeDispatch dispatch_;
    Tensor xe_, ye_;
    int64_t expert_capacity_ = 0;
    Tensor shared_out_;  // [N, C]
    bool drop_act_ = false, drop_permute_ = false,
         drop_experts_ = false;  // recompute moe_act, moe_permute, moe_experts
    DropList dropped_;
    Tensor d_scores_aux_;  // [N, E] the aux loss's gradient on the scores (aux_loss balancing only), from forward
};

}  // namespace mt::nn
