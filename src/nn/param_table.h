// The parameter table: built once from the model config, the only place that decides per-tensor attributes
// (shape, init, weight decay, optimizer group; sharding comes later). Each state family lives in one contiguous
// arena on the model's device, and every parameter is a named view into each: the weights the forward reads,
// the master weights the optimizer updates (the same arena unless the precision keeps an fp32 master copy), and
// the gradients (in the master dtype).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/precision.h"

namespace mt::nn {

using core::DType;
using core::Shape;
using core::Tensor;

// normal: N(0, init_std^2). log_uniform: log(u), u ~ U(init_lo, init_hi) (KDA's A_log under the softplus gate).
// softplus_inv_log_uniform: log(e^delta - 1), log(delta) ~ U(log init_lo, log init_hi) (KDA's dt_bias).
enum class InitKind { normal, ones, zeros, log_uniform, softplus_inv_log_uniform };
// The optimizer of a parameter (muon.md §2): Muon for the hidden matrices (every nn::Linear weight and the stacked
// expert matrices, optim/muon.h) when optim.name = "muon", AdamW for everything else; with optim.name = "adamw" every
// group is AdamW's.
enum class OptimGroup { adamw, muon };

struct ParamSpec {
    std::string name;  // canonical name, also the checkpoint key and the PyTorch reference's state_dict key
    Shape shape;
    InitKind init = InitKind::normal;
    double init_std = 0.02;
    double init_lo = 0.0, init_hi = 1.0;  // the range of the log_uniform kinds
    bool weight_decay = true;
    OptimGroup group = OptimGroup::adamw;
    // Expert parallelism: this rank holds rows [shard_first, shard_first + shape[0]) of a global tensor whose first
    // dimension is shard_global (0: not sharded, shape is the global shape). Sharded tensors are replicated only
    // over the ranks holding the same experts (the edp group), so their gradients are reduced there.
    int64_t shard_first = 0;
    int64_t shard_global = 0;
    // Tensor parallelism (docs/distributed.md): this rank holds [tp_first, tp_first + shape[tp_axis]) along dimension
    // tp_axis of a global tensor whose size there is tp_global (tp_axis -1: not split). The last shard may reach past
    // tp_global (a vocabulary padded to a multiple of tp): those rows are zeros and belong to no global tensor.
    int tp_axis = -1;
    int64_t tp_first = 0;
    int64_t tp_global = 0;
    // Ranks of the tp group holding this same shard (key/value heads when tp exceeds them: each is replicated on
    // tp / n_kv_heads ranks, whose gradients the trainer sums). 1: every tp rank holds its own.
    int64_t tp_replicas = 1;
    // Replicated over tp, but each tp rank's gradient is only its part (norm gains under sequence parallelism, the
    // router, KDA's low-rank down projections): the gradient is summed over tp as well as over the data ranks.
    bool tp_partial_grad = false;
    // Rows per attention head of a q, k or v projection [heads x head_rows, in] (0: not one): muon.per_head
    // orthogonalises each head's rows as a matrix of its own (muon.md §2).
    int64_t head_rows = 0;
};

// A parameter's reduction group: dense ones over the data-parallel span, tp-partial ones over that span times tp,
// expert-sharded ones over the ranks holding the same experts (edp).
enum class ParamReduce : uint8_t { dense, dense_tp, expert };

// The global shape of a parameter (its shape with the first dimension widened back when it is expert-sharded).
Shape param_global_shape(const ParamSpec& spec);
inline bool param_expert_sharded(const ParamSpec& spec) {
    return spec.shard_global > 0;
}
// Where this rank's part starts in the row-major flattened global tensor (0 unless expert-sharded: the experts of
// lower ranks come first). A tp shard's part is a box (param_box), not a run: for it this is the start of a
// numbering unique to the shard (the global offset only for a split along dimension 0), which stochastic rounding
// keys on.
int64_t param_shard_flat_offset(const ParamSpec& spec);
inline bool param_tp_split(const ParamSpec& spec) {
    return spec.tp_axis >= 0;
}
// The extent of the real (not padding) part along tp_axis: shape[tp_axis] but for a padded last shard.
int64_t param_tp_real(const ParamSpec& spec);
// This rank's part of the global tensor as a box: the offset of its first element along each dimension, and the
// extent of its real part (its shape, less a tp shard's padding). A replicated parameter is the whole tensor.
struct ParamBox {
    Shape offset, extent;
};
ParamBox param_box(const ParamSpec& spec);
ParamReduce param_reduce(const ParamSpec& spec);

class ParamTable {
   public:
    // Declares a parameter; returns its index. Only before finalize().
    int add(ParamSpec spec);
    // Allocates the arenas (zeroed) as the precision says. Every parameter starts at a multiple of `align`
    // elements (at least 64: 128-byte aligned views); data parallelism passes a multiple of its group sizes so that
    // every run of parameters splits evenly into reduce-scatter shards.
    void finalize(const Precision& precision, int64_t align = 64);
    // finalize()'s layout without the arenas: the offsets, padded sizes and totals (and arena_bytes) become valid,
    // nothing is allocated and no view exists. The memory planner (parallel/plan_memory.h) sizes a 2.6B-parameter
    // model this way in milliseconds. A laid-out table takes no more parameters and cannot be finalized.
    void layout(const Precision& precision, int64_t align = 64);
    // Fills the master weights from their init spec (and refreshes the forward's copy); parameter i draws from
    // Philox stream hash(name), so values depend neither on declaration order nor on threads or device; an
    // expert-sharded parameter takes its rows of the global tensor, so it equals the one-process values.
    void initialize(uint64_t seed);
    // Copies the master weights into the forward's weights (after an optimizer step or a load).
    void refresh_params_from_master();
    // Zeroes every gradient. skip_written_whole: not those declared with set_grad_written_whole (most of a model's
    // bytes: the weight matrices), which the next backward writes before anything reads them; a backward settles
    // what it did not write (settle_grads). The trainer's step passes it; a caller that reads gradients without a
    // backward in between must not.
    void zero_grads(bool skip_written_whole = false);
    // Declares that parameter i's gradient is written whole by its first write of every backward pass over its layer
    // (nn::Linear, the MoE experts: the ops' accumulate_dw = false), so zero_grads may leave it. Before finalize.
    void set_grad_written_whole(int i);
    // Whether the backward may write (=) parameter i's gradient instead of adding to it (+=): true for the first
    // write after zero_grads() (or finalize), then false until the next zero_grads(). The layers whose gradient op
    // can write (nn::Linear and the MoE experts, through linear_bwd's and grouped_linear_bwd's accumulate_dw) ask
    // before each write: the same values as adding to zeros, without the read of the gradient (or its zeroing, for a
    // gradient zero_grads left). A later micro-batch, recompute segment or second use then adds.
    bool first_grad_write(int i);
    // Zeroes the gradients of index >= first that zero_grads left and no write has reached yet (a layer that did
    // not run): the model calls it at the end of each backward (the trainer, after a schedule of several pipeline
    // chunks) and before it hands gradients to data parallelism.
    void settle_grads(int first = 0);
    // Off: first_grad_write always answers false and zero_grads zeroes everything. CUDA graphs turn it off: a
    // captured backward replays for every micro-batch, so what it records must be the add.
    void set_first_grad_writes(bool on) {
        first_grad_writes_ = on;
    }

    int size() const {
        return static_cast<int>(specs_.size());
    }
    const ParamSpec& spec(int i) const {
        return specs_.at(static_cast<size_t>(i));
    }
    int find(const std::string& name) const;  // -1 when absent
    // The weights the forward reads (bf16 under mixed precision).
    Tensor param(int i) const {
        return params_.at(static_cast<size_t>(i));
    }
    // The weights the optimizer updates and checkpoints store (the same view as param(i) without a master copy).
    Tensor master(int i) const {
        return masters_.at(static_cast<size_t>(i));
    }
    Tensor grad(int i) const {
        return grads_.at(static_cast<size_t>(i));
    }
    int64_t offset(int i) const {
        return offsets_.at(static_cast<size_t>(i));
    }  // elements into the arenas
    // Elements parameter i occupies in the arenas (its numel rounded up to the alignment).
    int64_t padded_numel(int i) const {
        return (i + 1 < size() ? offsets_.at(static_cast<size_t>(i) + 1) : total_) - offset(i);
    }
    int64_t total_numel() const {
        return total_;
    }
    // Bytes of one arena of `dtype` with the table's layout (what finalize and make_arena allocate), after layout.
    int64_t arena_bytes(DType dtype) const {
        return total_ * static_cast<int64_t>(core::dtype_size(dtype));
    }
    const Precision& precision() const {
        return precision_;
    }
    Tensor param_arena() const {
        return param_arena_;
    }
    Tensor master_arena() const {
        return master_arena_;
    }
    Tensor grad_arena() const {
        return grad_arena_;
    }
    // A new arena of the same layout on the table's device (optimizer state families use it), and parameter i's
    // view into it.
    Tensor make_arena(DType dtype) const;
    Tensor view(const Tensor& arena, int i) const;

   private:
    // Parameter i's master drawn where it lives when that is the GPU (normal, ones, zeros, not tp-split); false
    // when the host must draw it.
    bool initialize_on_device(int i, uint64_t seed);

    std::vector<ParamSpec> specs_;
    std::unordered_map<std::string, int> index_;
    std::vector<int64_t> offsets_;
    std::vector<Tensor> params_, masters_, grads_;
    Tensor param_arena_, master_arena_, grad_arena_;
    // Per parameter, since the last zero_grads(): kZeroed, kWritten, or kLeft (zero_grads skipped it, not written).
    enum GradState : uint8_t { kZeroed, kWritten, kLeft };
    std::vector<uint8_t> grad_state_;
    std::vector<uint8_t> written_whole_;                    // set_grad_written_whole, per parameter
    std::vector<std::pair<int64_t, int64_t>> zeroed_runs_;  // the arena runs zero_grads(true) zeroes: [begin, end)
    bool first_grad_writes_ = true;
    int64_t total_ = 0;
    Precision precision_;
    bool laid_out_ = false;  // offsets_ and total_ are set (layout or finalize)
    bool finalized_ = false;
};

}  // namespace mt::nn
