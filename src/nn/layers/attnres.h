// Block Attention Residuals over a stack of blocks (../shared/spec/attnres.md §3, §6): the plain residual stream
// is replaced by, before each of the L = 2 * n_layers sub-layers, a softmax mix (ops/attnres_mix.h) of the
// embedding b_0, the completed block sums b_1..b_{n-1} and the current block's partial sum; a final mix of every
// block feeds the final norm. Parameters: per mix l = 1..L+1, `attnres.mix.{l}.query` (zero init) and
// `attnres.mix.{l}.key_norm` (ones), both without weight decay. Stored per micro-batch: every partial sum (as the
// plain model keeps its residual stream), every mixed input h_l (the recompute_mix = false form of §6) and every
// alpha. Gradients of the sources accumulate in f32 under mixed precision.
#pragma once

#include <memory>
#include <vector>

#include "nn/block.h"
#include "nn/tensor_parallel.h"

namespace mt::nn {

class AttnResStack {
   public:
    // Registers the L + 1 mixes' parameters.
    // tp: under sequence parallelism the mixes run on this rank's rows (their parameters' gradients are parts).
    AttnResStack(ParamTable& table, const ModelConfig& cfg, const TensorParallel& tp = {});

    void resize(int64_t n, const Precision& precision);
    // The optimizer step the next forward and backward belong to (the residual blend's schedule).
    void set_step(int64_t step) {
        blend_ = cfg_.attnres.blend_at(step);
    }
    double blend() const {
        return blend_;
    }
    // e: [N, C] the embedding output (kept alive until backward). Runs every block's two sub-layers and returns
    // the final mix [N, C], the input of the final norm.
    const Tensor& forward(const Tensor& e, std::vector<std::unique_ptr<Block>>& blocks, Workspace& ws);
    // The last forward's final mix.
    const Tensor& forward_output() const {
        return mixed_.back();
    }
    // d_final: [N, C] gradient of the final mix output; de: [N, C] written (=) with the embedding's gradient.
    void backward(const Tensor& e,
                  std::vector<std::unique_ptr<Block>>& blocks,
                  const Tensor& d_final,
                  const Tensor& de,
                  Workspace& ws);
    std::vector<SavedTensor> saved_for_backward();

   private:
    // Mix l's sources (0-based sub-layer l; l == L is the final mix): the embedding (index -1), the completed
    // blocks' last partial sums, and the running partial sum of l's own block when l is not its first sub-layer.
    std::vector<int64_t> sources_of(int64_t l) const;
    const Tensor& partial_or_embedding(int64_t idx, const Tensor& e) const;

    ModelConfig cfg_;
    ParamTable* table_;
    int64_t layers_ = 0, block_ = 1;  // L sub-layers, S per block
    double blend_ = 0.0;              // the residual blend lambda of this step
    std::vector<int> query_, gain_;   // per mix, L + 1
    std::vector<Tensor> partial_;     // [L] of [N, C]: partial_[l] = partial sum of l's block through sub-layer l
    std::vector<Tensor> mixed_;       // [L + 1] of [N, C]: the mixed inputs h_l and the final mix
    std::vector<Tensor> alpha_;       // [L + 1] of [N, m_l]
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
};

}  // namespace mt::nn
