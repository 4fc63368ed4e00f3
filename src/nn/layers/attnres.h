// Block Attention Residuals over a stack of blocks (../shared/spec/attnres.md §3, §6): the plain residual stream
// is replaced by, before each of the L = 2 * n_layers sub-layers, a softmax mix (ops/attnres_mix.h) of the
// embedding b_0, the completed block sums b_1..b_{n-1} and the current block's partial sum; a final mix of every
// block feeds the final norm. Parameters: per mix l = 1..L+1, `attnres.mix.{l}.query` (zero init) and
// `attnres.mix.{l}.key_norm` (ones), both without weight decay. Stored per micro-batch: every partial sum (as the
// plain model keeps its residual stream), every mixed input h_l (the recompute_mix = false form of §6) and every
// alpha. Gradients of the sources accumulate in f32 under mixed precision.
//
// Under pipeline parallelism (attnres.md §7) each rank holds the mixes of its chunks' sub-layers (and the final mix
// on the last stage) and runs one chunk per pass; the sources a chunk reads from upstream (the embedding, completed
// block sums, the running partial of a block cut by the chunk boundary) come from an AttnResCarry, which also
// collects their gradients.
#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "nn/block.h"
#include "nn/layer_stats.h"
#include "nn/tensor_parallel.h"

namespace mt::nn {

// The sources of mix l (0-based sub-layer l of L; l == L is the final mix) in blocks of S sub-layers, in source
// order: the embedding (-1), each completed block's sum (by the index of its last sub-layer), and the running
// partial sum of l's own block (index l - 1) when l is not the block's first sub-layer.
std::vector<int64_t> attnres_sources(int64_t l, int64_t layers, int64_t block);

// Pipeline parallelism: the sources the hop into chunk k carries (the previous chunk's stage sends them), for the
// model's chunks as sub-layer ranges [first, last) in model order spread over `stages` ranks (chunk k on rank
// k mod stages). Every source of the chunk's first mix; with cache, less what the receiving rank kept from its
// previous chunk of the same micro-batch (k - stages): the embedding and every block completed before that chunk
// ended (attnres.md §7). The backward sends the gradients of the same sources the other way.
std::vector<int64_t> attnres_hop_sources(
    const std::vector<std::pair<int64_t, int64_t>>& chunks, int64_t k, int64_t stages, bool cache, int64_t block);

// What Block AttnRes carries between the pipeline chunks of one micro-batch on one rank: the upstream sources a
// chunk received (by attnres_sources' index) and the ones it produced that a later chunk or the next stage reads,
// and the accumulators (master dtype) of their gradients, which every reader's backward adds to.
struct AttnResCarry {
    std::map<int64_t, Tensor> values, grads;
};

// One pass of the stack: the sub-layers [first, last) (the whole model, or one pipeline chunk's), whether the pass
// holds the embedding (else the carry does) and the final mix, and the carry (null without pipeline parallelism).
struct AttnResPass {
    int64_t first = 0, last = 0;
    bool embedding = true, head = true;
    AttnResCarry* carry = nullptr;
    // Source idx is the pass's own (the embedding it looked up, a partial sum it computes), not the carry's.
    bool owns(int64_t idx) const {
        return idx < 0 ? embedding : first <= idx && idx < last;
    }
};

class AttnResStack {
   public:
    // Registers the mixes' parameters: those of the sub-layers of `part`'s chunks (the whole model when it is
    // empty) and, where the part holds the last layer, the final mix's.
    // tp: under sequence parallelism the mixes run on this rank's rows (their parameters' gradients are parts).
    AttnResStack(ParamTable& table, const ModelConfig& cfg, const TensorParallel& tp = {}, const ModelPart& part = {});

    void resize(int64_t n, const Precision& precision);
    // The optimizer step the next forward and backward belong to (the residual blend's schedule).
    void set_step(int64_t step) {
        blend_ = cfg_.attnres.blend_at(step);
    }
    double blend() const {
        return blend_;
    }
    // e: [N, C] the embedding output (kept alive until backward; unused when the carry holds it). blocks: by
    // global layer (null for a layer this rank does not hold). Runs the pass's sub-layers and, with the head, the
    // final mix [N, C] (forward_output(), the input of the final norm). With a carry and no head, leaves in it the
    // embedding (if the pass holds it), every block the pass completed and its last partial sum, for later chunks.
    void forward(const AttnResPass& pass, const Tensor& e, const std::vector<Block*>& blocks, Workspace& ws);
    // The last forward's final mix.
    const Tensor& forward_output() const {
        return mixed_.back();
    }
    // d_final: [N, C] gradient of the final mix output (with the head); de: [N, C] written (=) with the
    // embedding's gradient (when the pass holds it). The gradients of the pass's own sources start from the carry's
    // (taken out of it); those of upstream sources are added to the carry's.
    void backward(const AttnResPass& pass,
                  const Tensor& e,
                  const std::vector<Block*>& blocks,
                  const Tensor& d_final,
                  const Tensor& de,
                  Workspace& ws);
    std::vector<SavedTensor> saved_for_backward();
    // metrics.layer_stats: the step's stat buffer (nn/layer_stats.h, [layout size] f64) that the next forward adds
    // each mix's weights and entropy to, and, from the mix that follows layer j's FFN (the next layer's input, or the
    // final mix), layer j's activation moments; undefined: nothing.
    void set_layer_stats(const Tensor& slots) {
        stats_ = slots;
    }

   private:
    std::vector<int64_t> sources_of(int64_t l) const {
        return attnres_sources(l, layers_, block_);
    }
    bool holds(int64_t l) const;  // this rank runs sub-layer l (l == L: the final mix)
    // A source of the pass, and the accumulator of its gradient: the pass's own (the embedding it looked up, a
    // partial sum it computed) or the carry's.
    const Tensor& source(const AttnResPass& pass, int64_t idx, const Tensor& e) const;
    const Tensor& source_grad(const AttnResPass& pass, int64_t idx);

    ModelConfig cfg_;
    ParamTable* table_;
    int64_t layers_ = 0, block_ = 1;                 // L sub-layers, S per block
    double blend_ = 0.0;                             // the residual blend lambda of this step
    int64_t rows_ = -1;                              // N of the buffers
    std::vector<std::pair<int64_t, int64_t>> held_;  // the sub-layer ranges this rank runs
    bool head_ = true;                               // and the final mix
    // Per mix, L + 1; the buffers below are defined only for the mixes this rank holds.
    std::vector<int> query_, gain_;  // -1 where not held
    std::vector<Tensor> partial_;    // [L] of [N, C]: partial_[l] = partial sum of l's block through sub-layer l
    std::vector<Tensor> mixed_;      // [L + 1] of [N, C]: the mixed inputs h_l and the final mix
    std::vector<Tensor> alpha_;      // [L + 1] of [N, m_l]
    // Recompute attnres (recompute_mix): mixed_[l], l < L, freed once its sub-layer has run, rebuilt by the mix
    // forward before the sub-layer's backward.
    bool drop_mixed_ = false;
    std::vector<DropList> mixed_dropped_;
    // Gradient accumulators in the master dtype (f32 under mixed precision: a block's gradient sums the
    // contributions of every later mix, which bf16 would round at each add).
    std::vector<Tensor> d_partial_;  // [L] of [N, C]
    Tensor d_embed_;                 // [N, C] the embedding's
    Tensor d_branch_, d_mixed_;      // [N, C] scratch in the compute dtype
    Tensor zero_;                    // [N, C] zeros in the compute dtype: add_fwd(acc, zero_, out) rounds acc to it
    LayerStatsLayout stats_layout_;  // set_layer_stats
    Tensor stats_;
};

}  // namespace mt::nn
