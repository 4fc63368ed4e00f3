// Activation recompute ([recompute] in the job TOML; docs/training.md "Memory"): which of the activations a forward
// saves for its backward (Layer::saved_for_backward) are dropped after the forward and rebuilt in the backward by
// re-running the part of the forward that made them, on the same inputs with the same kernels (so the gradients are
// the ones of policy none, bit for bit on the CPU).
//   none       keep everything (the default)
//   selective  drop the activations of the named modules (RecomputeModule)
//   full       keep only one block input per `every` blocks; the backward re-runs each group of blocks' forward
//              (under Block AttnRes: each sub-layer from its mixed input, every = 1)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/enum_names.h"

namespace mt::nn {

enum class RecomputePolicy { none, selective, full };

template <>
struct EnumNames<RecomputePolicy> {
    static constexpr std::array<std::pair<RecomputePolicy, const char*>, 3> names = {
        {{RecomputePolicy::none, "none"}, {RecomputePolicy::selective, "selective"}, {RecomputePolicy::full, "full"}}};
};

// What a module drops, and what its backward re-runs:
//   attn_core    softmax attention's q, k, v, output and lse: the q/k/v projections, RoPE and the attention forward
//   kda          every KDA activation (projections, convs, gate, beta, the recurrence's output and kept tiles): the
//                layer's forward up to its output projection, from the layer input
//   mlp_act      the dense MLP's SwiGLU output silu(gate) * up: one elementwise op
//   moe_act      the routed and shared experts' SwiGLU outputs: one elementwise op each
//   norm         the pre-norm RMSNorm outputs of both sub-layers: the norm forward (the 1/rms rows are kept)
//   attnres      the AttnRes mixed inputs h_l (attnres.md §6, recompute_mix): the mix forward from the sources
//   moe_permute  the token rows gathered in expert order (and, under expert parallelism, the rows received): the
//                gather (and the all-to-all)
//   moe_experts  the routed experts' rows: gate and up projections, SwiGLU output and output rows (moe.md's
//                `moe.recompute = "experts"`): the experts' three grouped GEMMs and the SwiGLU, from the gathered
//                rows (under expert parallelism also the return all-to-all)
enum class RecomputeModule { attn_core, kda, mlp_act, moe_act, norm, attnres, moe_permute, moe_experts };

template <>
struct EnumNames<RecomputeModule> {
    static constexpr std::array<std::pair<RecomputeModule, const char*>, 8> names = {
        {{RecomputeModule::attn_core, "attn_core"},
         {RecomputeModule::kda, "kda"},
         {RecomputeModule::mlp_act, "mlp_act"},
         {RecomputeModule::moe_act, "moe_act"},
         {RecomputeModule::norm, "norm"},
         {RecomputeModule::attnres, "attnres"},
         {RecomputeModule::moe_permute, "moe_permute"},
         {RecomputeModule::moe_experts, "moe_experts"}}};
};

struct RecomputeConfig {
    RecomputePolicy policy = RecomputePolicy::none;
    std::vector<RecomputeModule> modules = {};  // selective: the modules whose activations are dropped
    int64_t every = 1;                          // full: one kept block input per `every` blocks; 0 = "sqrt"

    bool drops(RecomputeModule m) const {
        return policy == RecomputePolicy::selective && std::find(modules.begin(), modules.end(), m) != modules.end();
    }
    bool full() const {
        return policy == RecomputePolicy::full;
    }
    // Blocks per kept input: `every`, or for "sqrt" the integer nearest sqrt(n_layers) (at least 1), the O(sqrt L)
    // checkpointing scheme (Chen et al. 2016).
    int64_t group_size(int64_t n_layers) const {
        if (every > 0) return every;
        return std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(n_layers))));
    }
};

// A layer's dropped activations: the buffers it frees after its forward and allocates again (contents undefined)
// before it rebuilds them in its backward. Shapes are recorded when the layer sizes its buffers.
class DropList {
   public:
    void clear() {
        items_.clear();
    }
    // t: a defined buffer of the layer (its shape, dtype and device are what restore() brings back).
    void add(core::Tensor* t) {
        items_.push_back({t, t->shape(), t->dtype(), t->device()});
    }
    bool empty() const {
        return items_.empty();
    }
    void release() const {
        for (const Item& i : items_) *i.tensor = core::Tensor();
    }
    void restore() const {
        for (const Item& i : items_)
            if (!i.tensor->defined()) *i.tensor = core::Tensor::scratch(i.shape, i.dtype, i.device);
    }

   private:
    struct Item {
        core::Tensor* tensor;
        core::Shape shape;
        core::DType dtype;
        core::Device device;
    };
    std::vector<Item> items_;
};

}  // namespace mt::nn
