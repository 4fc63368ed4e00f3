// Causal softmax attention over context-parallel ranks (long_context.md §7): each rank holds the queries, keys and
// values of its two zigzag chunks (nn/context_parallel.h).
//   allgather (cp.attn = "allgather", cp_attention.cpp): the forward all-gathers the keys and values of the whole
//       sequence over the cp group; each local chunk g then attends to the keys [0, (g + 1) c), the causal prefix of
//       its last query (the attention op's key prefix, ops/attention.h), with the document map in global positions.
//       The backward gathers the keys and values again (so that nothing of the size of the whole sequence is held
//       from the forward to the backward), runs the same two prefix backwards, adds their key/value gradients into
//       the whole sequence's and reduce-scatters them: each rank gets the gradient of its own keys from every
//       rank's queries.
//   ring (cp.attn = "ring", cp_attention_ring.cpp; zhuzilin/ring-flash-attention's zigzag ring): cp steps, each
//       passing the key/value shard it holds to rank r + 1 while computing on it. Step 0: both local chunks attend
//       causally to the local keys. Step i >= 1 holds the shard of rank j = (r - i) mod cp: if j < r, both local
//       query chunks attend to its first chunk (wholly in their past: no causal mask); if j > r, only the second
//       local query chunk attends, to both of its chunks. Each step's result merges into the running one by
//       log-sum-exp (ops/attention_past.h). The backward runs the same steps with the final out and lse, and the
//       shards travel the ring again with their key/value gradient accumulators, which a last pass carries home.
//   window (a sliding-window layer, attn.window = w; either mode): a query sees at most the w - 1 positions before it,
//       so each span needs only the w - 1 rows before its first (the halo), fetched point to point from the ranks
//       that hold them (nn/context_parallel.h cp_rows_before; several chunks when w - 1 exceeds a chunk). Each local
//       chunk attends to its halo and itself with the window mask; the backward fetches the halo again and sends its
//       key/value gradients home. O(w) keys moved per span instead of the whole sequence. The global tokens and the
//       sink (attention_layer.cpp, merged after this) are token-local: every rank computes them.
// All give one process's results up to the order of the sums.
#pragma once

#include <array>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/context_parallel.h"

namespace mt::parallel {
class CommWork;
}

namespace mt::nn {

class CpAttention {
    using Tensor = core::Tensor;

   public:
    CpAttention() = default;
    // window > 0: a sliding-window layer's (a query sees itself and the window - 1 positions before it).
    explicit CpAttention(const ContextParallel& cp, int64_t window = 0) : cp_(cp), window_(window) {}
    bool active() const {
        return cp_.active();
    }
    int64_t ranks() const {
        return cp_.size;
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
    // The same element-wise over a vector (the per-head maxima), in place; one all-reduce, the same size on every rank.
    void max_over_group(std::vector<double>& values) const;

    // With sequence segments (long_context.md §4; the batch is one segment): the layer's caches (segment_kv.h,
    // window_kv.h) hold the earlier segments' keys and values whole on every rank, as in one process, so each rank
    // gathers its segment's keys (gather_keys) into them and its two chunks attend to the cached keys [key_lo, first
    // + total) in whole-row positions (either cp.attn: the cache is the whole sequence's anyway). The backward writes
    // dq and the gradient of every cached key row (dk_all, dv_all over [key_lo, first + total)), this rank's
    // queries' part of the sum that the caller reduce-scatters.
    void segment_forward(const Tensor& q,
                         const Tensor& keys,
                         const Tensor& values,
                         int64_t key_lo,
                         const Tensor& out,
                         const Tensor& lse,
                         const Tensor& max_logit = Tensor()) const;
    void segment_backward(const Tensor& q,
                          const Tensor& keys,
                          const Tensor& values,
                          int64_t key_lo,
                          const Tensor& out,
                          const Tensor& lse,
                          const Tensor& dout,
                          const Tensor& dq,
                          const Tensor& dk_all,
                          const Tensor& dv_all) const;
    // The whole split sequence's keys and values [B, total, Hkv, D], gathered.
    std::pair<Tensor, Tensor> gather_keys(const Tensor& k, const Tensor& v) const;
    // Each rank holding a part of a sum over the split sequence's rows `whole` [B, total, ...]: this rank's rows of
    // the sum into `local` (cp_reduce_scatter_rows over the group).
    void reduce_scatter(const Tensor& whole, const Tensor& local) const {
        cp_reduce_scatter_rows(cp_, whole, local);
    }

   private:
    // The arguments of forward (the layer's q, k, v and its out, lse) and the gradients of backward.
    struct Io {
        Tensor q, k, v, out, lse;
    };
    struct Grads {
        Tensor dout, dq, dk, dv;
    };
    void allgather_forward(const Io& io, const Tensor& max_logit) const;
    void allgather_backward(const Io& io, const Grads& g) const;
    void ring_forward(const Io& io, const Tensor& max_logit) const;
    void ring_backward(const Io& io, const Grads& g) const;
    void window_forward(const Io& io, const Tensor& max_logit) const;
    void window_backward(const Io& io, const Grads& g) const;
    // A window layer's keys or values of span s: its halo rows, then the span's own c rows ([B, h + c, Hkv, D]).
    Tensor window_keys(const std::array<Tensor, 2>& halo, const Tensor& local, int s) const;
    // Ring: the document map of step 0 (the local chunks in local positions), and each query's first visible key of
    // rank j's shard (its first chunk when j < r, both chunks for the second local chunk's queries when j > r);
    // undefined without document masking.
    Tensor ring_local_map(core::Device device) const;
    Tensor ring_first_keys(int64_t j, core::Device device) const;
    // Ring: send `held` to rank r + 1 and receive rank r - 1's into `next` (host tensors of one shape), started.
    std::vector<parallel::CommWork> ring_pass(const Tensor& held, const Tensor& next, int tag) const;
    ContextParallel cp_;
    int64_t window_ = 0;
    CpBatch batch_;
};

}  // namespace mt::nn
