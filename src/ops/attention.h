// Softmax attention with grouped-query heads (GQA): query head h reads key/value head h / (Hq / Hkv). Causal by
// default; AttentionMask::causal = false is bidirectional attention within each document (the vision encoder's packed
// images, multimodal.md §1).
//   q:   [B, T, Hq, D] f32|f64
//   k,v: [B, Tk, Hkv, D], Hq % Hkv == 0, Tk >= T: the queries are the last T positions of the Tk keys (query i sits
//        at position Tk - T + i; Tk > T is a key prefix, the cache of earlier positions that a sequence segment or a
//        context-parallel chunk attends to, long_context.md §4 and §7; every CPU and CUDA kernel takes it)
//   out: [B, T, Hq, D]
//   lse: [B, Hq, T] saved for backward: log-sum-exp of the scaled scores of each query row
//   max_logit (optional): [B, Hq, T] in the dtype of lse, the largest scaled score q.k / sqrt(D) of each query row over
//        the keys it sees (natural-log units, as lse), the logit QK-clip reads (long_context.md §9, muon.md); an
//        undefined tensor (the default) is not written and costs nothing. Only this op's keys: the global tokens and
//        the sink that ops/attention_global.h merges in afterwards are not in it
// scores = q k^T / sqrt(D), masked to keys at positions <= the query position, with mask.doc_start to the keys of the
// query's own document (document masking of packed sequences, long_context.md §2) and with mask.window to the last
// `window` keys (sliding-window attention): query t sees keys s with max(doc_start[t], t - window + 1) <= s <= t.
// Global (memory) tokens and a sink logit are ops/attention_global.h, merged into out and lse after this op.
// _bwd: dq, dk, dv written (=); dk and dv cover all Tk keys (a prefix's gradient from these queries alone).
// A document map and a window are over the Tk positions ([B, Tk]); query i uses the entry of its position.
// Bidirectional (mask.causal = false, no window): query t sees every key s of its own document, doc_start[s] ==
// doc_start[t] (every key of the row without a document map); a document that starts before the queries (a key
// prefix) is seen whole, as is the rest of the query's document after it.
#pragma once

#include <string>

#include "ops/op_common.h"

namespace mt::ops {

// The CUDA kernel family: automatic picks wgmma on Hopper and mma.sync elsewhere for bf16 with D a multiple of 8 up to
// 128 and 16-byte aligned tensors (causal, or bidirectional: every family has both), the generic kernels otherwise. A
// named family falls back where it cannot run: the tensor-core ones to generic for other dtypes, head dims or
// alignments, wgmma to mma before Hopper. The CPU ignores it.
enum class AttentionKernel { automatic, wgmma, mma, generic };

// Which CUDA kernels a call runs. The layers keep the defaults; a test or benchmark sets a field to reach a variant.
struct AttentionOptions {
    AttentionKernel kernel = AttentionKernel::automatic;
    // The wgmma backward: the 5-matmul kernel, dq by float reductions in a fixed order with core::exec().deterministic
    // ("cuda-wgmma-ordered"), else as scheduled ("-fast"); false: the two-kernel deterministic one, 7 matmuls (A/B).
    bool fast_bwd = true;
    // When set, the call writes the kernels it ran here (benchmarks print it as their `impl`).
    std::string* chosen = nullptr;
};

// Which keys a query may see beyond causality (what the attention computes, unlike AttentionOptions).
struct AttentionMask {
    // [B, Tk] i32 on the device of q: the position (in its row) of the first token of each token's document, so
    // query t sees keys s with doc_start[t] <= s <= t. Within a row it is t at a document's first token and its
    // predecessor's value elsewhere. Undefined: each row is one document.
    Tensor doc_start = Tensor();
    // > 0: a query sees at most this many keys, itself and the window - 1 before it. 0: no window.
    int64_t window = 0;
    // false: no causal limit, a query sees its whole document (with window 0 only).
    bool causal = true;
};

void attention_fwd(const Tensor& q,
                   const Tensor& k,
                   const Tensor& v,
                   const Tensor& out,
                   const Tensor& lse,
                   const AttentionOptions& options = {},
                   const AttentionMask& mask = {},
                   const Tensor& max_logit = Tensor());
void attention_bwd(const Tensor& q,
                   const Tensor& k,
                   const Tensor& v,
                   const Tensor& out,
                   const Tensor& lse,
                   const Tensor& dout,
                   const Tensor& dq,
                   const Tensor& dk,
                   const Tensor& dv,
                   const AttentionOptions& options = {},
                   const AttentionMask& mask = {});

}  // namespace mt::ops
