// Causal softmax attention over context-parallel ranks (long_context.md §7, cp.attn = "allgather"): each rank holds
// the queries, keys and values of its two zigzag chunks (nn/context_parallel.h). The forward all-gathers the keys and
// values of the whole sequence over the cp group; each local chunk g then attends to the keys [0, (g + 1) c), the
// causal prefix of its last query (the attention op's key prefix, ops/attention.h), with the document map in global
// positions. The backward gathers the keys and values again (so that nothing of the size of the whole sequence is
// held from the forward to the backward), runs the same two prefix backwards, adds their key/value gradients into
// the whole sequence's and reduce-scatters them: each rank gets the gradient of its own keys from every rank's
// queries. The results equal one process's up to the order of the sums.
#pragma once

#include "core/tensor.h"
#include "nn/context_parallel.h"

namespace mt::nn {

class CpAttention {
    using Tensor = core::Tensor;

   public:
    CpAttention() = default;
    explicit CpAttention(const ContextParallel& cp) : cp_(cp) {}
    bool active() const {
        return cp_.active();
    }
    // The sequence the next forward and its backward run on.
    void begin(const CpBatch& batch) {
        batch_ = batch;
    }
    int64_t total() const {
        return batch_.total;
    }
    // q: [B, L, Hq, D]; k, v: [B, L, Hkv, D], this rank's L = T / cp tokens (its two chunks in order); out [B, L, Hq,
    // D] and lse [B, Hq, L] written as attention_fwd's; max_logit [B, Hq, L] written when defined.
    void forward(const Tensor& q,
                 const Tensor& k,
                 const Tensor& v,
                 const Tensor& out,
                 const Tensor& lse,
                 const Tensor& max_logit = Tensor()) const;
    // out and lse: the forward's (after any merge of global tokens or the sink); dq, dk, dv [local] written (=).
    void backward(const Tensor& q,
                  const Tensor& k,
                  const Tensor& v,
                  const Tensor& out,
                  const Tensor& lse,
                  const Tensor& dout,
                  const Tensor& dq,
                  const Tensor& dk,
                  const Tensor& dv) const;
    // The largest of a value over the cp group (the layer's max logit, whose rows are spread over the ranks).
    double max_over_group(double value) const;

   private:
    // The whole sequence's keys and values [B, T, Hkv, D], gathered.
    std::pair<Tensor, Tensor> gather_keys(const Tensor& k, const Tensor& v) const;
    ContextParallel cp_;
    CpBatch batch_;
};

}  // namespace mt::nn
