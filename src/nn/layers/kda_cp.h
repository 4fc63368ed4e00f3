// KDA over context-parallel ranks (long_context.md §7): each rank holds two spans of the sequence, its zigzag chunks
// (nn/context_parallel.h), and the recurrence and the short convs must see the state and the rows of the spans
// before them.
//
// State. A span's chunked scan is affine in its start state: S_out = M S_in + h, M = prod_t (I - b_t k_t k_t^T)
// Diag(a_t) (K x K per value head; 0 when a document starts inside the span) and h the state reached from zero.
//   relay (cp.kda = "relay"): the spans run in global order, each receiving its start state from the span before
//       (point to point) and sending its end state on: serial, the oracle;
//   affine (cp.kda = "affine", LASP-2): every span scans once with its value columns extended by K columns of zero
//       values started from the identity, which gives h (the value columns, from zero) and M (the extra columns) in
//       one scan; the (M, h) of all spans are all-gathered and folded in global order on the host (f64), and every
//       span reruns from its true start state. The backward mirrors it: each span's reverse scan with a zero
//       end-state gradient gives its own start-state gradient, those are all-gathered and folded in reverse,
//       dS_in(j) = M_j^T dS_out(j) + dS_in_own(j), and every span runs its backward with its true end-state gradient.
// A span whose first token starts a document starts from zero (and passes no gradient back). Relay and affine give
// the same result up to rounding, and both equal one process's.
//
// Halo. Each span's short convs read the W - 1 projection rows before it, which the span before sends (point to
// point) before the convs; their gradients go back the same way and join the owner's. Rank cp - 1's two spans are
// neighbours, so it passes its own. The first span of the sequence reads zeros, as the conv's map of documents does
// at every document start.
//
// Segments (long_context.md §4, the batch one segment of a longer row): the segment's first chunk (rank 0's span 0)
// continues the state and reads the halo that the segment before left (set_carry: the state on every rank under
// affine, on rank 0 under relay, where the segment before ended it; the halo on rank 0, which held that segment's
// last chunk), and the backward takes the gradient of the segment's end state from the segment after and returns
// that of its start state and halo, on the same ranks.
#pragma once

#include <array>
#include <vector>

#include "core/tensor.h"
#include "nn/context_parallel.h"
#include "ops/kda.h"

namespace mt::parallel {
class CommWork;
}

namespace mt::nn {

class KdaCp {
    using Tensor = core::Tensor;

   public:
    KdaCp() = default;
    // halo_rows: W - 1 of the short conv.
    KdaCp(const ContextParallel& cp, int64_t halo_rows) : cp_(cp), halo_rows_(halo_rows) {}
    bool active() const {
        return cp_.active();
    }
    int64_t ranks() const {
        return cp_.size;
    }
    // The sequence the next forward and its backward run on, for `batch` rows on `device`.
    void begin(const CpBatch& batch, int64_t rows, core::Device device);
    // Segments after the first: the state [B, HV, K, V] and the three projections' halo rows [B, W - 1, C] the
    // segment continues from (undefined: zero), before exchange_halos. Rows whose document starts at the segment
    // ignore them.
    void set_carry(const Tensor& s0, const std::array<Tensor, 3>& halo) {
        carry_s0_ = s0;
        carry_halo_ = halo;
    }

    // Forward, before the convs: every span's last W - 1 rows of the three projections [B, L, C] (q, k, v) go to
    // the span after it.
    void exchange_halos(const std::array<Tensor, 3>& proj);
    // Conv `which` (0 q, 1 k, 2 v) of x [B, L, C] into y over both spans with their halos; backward: dx written,
    // dw accumulated, the halos' gradients kept for return_halo_grads.
    void conv_forward(int which, const Tensor& x, const Tensor& w, const Tensor& y) const;
    void conv_backward(
        int which, const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw);
    // After the three conv backwards: the halo rows' gradients go back to the spans that own those rows and are added
    // to their projections' gradients dproj [B, L, C] (q, k, v). Returns the gradient of the carried halo (rank 0 of
    // a segment after the first; undefined elsewhere).
    std::array<Tensor, 3> return_halo_grads(const std::array<Tensor, 3>& dproj);

    // The recurrence over both spans (ops/kda.h shapes with T = L, this rank's tokens; options without a document
    // map, the spans' own are taken from the batch): o written; st the state after the sequence's last token (rank 0
    // holds it under relay, every rank under affine; the last span's end state elsewhere).
    void forward(const Tensor& q,
                 const Tensor& k,
                 const Tensor& v,
                 const Tensor& g,
                 const Tensor& beta,
                 const ops::KdaOptions& options,
                 const Tensor& o,
                 const Tensor& st);
    // dq, dk, dv, dg, dbeta written (=); d_end: the end state's gradient (undefined: zero; a segment before the last
    // takes the next one's, on the ranks set_carry names). Returns the carried start state's gradient on those ranks
    // (undefined without a carry).
    Tensor backward(const Tensor& q,
                    const Tensor& k,
                    const Tensor& v,
                    const Tensor& g,
                    const Tensor& beta,
                    const ops::KdaOptions& options,
                    const Tensor& d_o,
                    const Tensor& dq,
                    const Tensor& dk,
                    const Tensor& dv,
                    const Tensor& dg,
                    const Tensor& dbeta,
                    const Tensor& d_end = Tensor()) const;

   private:
    // Point to point with the neighbouring ranks of the group: to_next goes to rank r + 1, to_prev to r - 1, and
    // from_prev, from_next receive theirs (each skipped at the group's ends). All one shape, host memory.
    void swap_with_neighbours(
        const Tensor& to_next, const Tensor& to_prev, const Tensor& from_prev, const Tensor& from_next, int tag) const;
    // One span's inputs and options.
    struct Span {
        Tensor q, k, v, g, beta;
        ops::KdaOptions options;
    };
    Span span(int s,
              const Tensor& q,
              const Tensor& k,
              const Tensor& v,
              const Tensor& g,
              const Tensor& beta,
              const ops::KdaOptions& options) const;
    // Whether global chunk g's first token starts a document in row b (its start state is zero then).
    bool resets(int64_t chunk, int64_t b) const;
    // Rows of a state [B, ...] whose span starts a document: zeroed.
    void zero_resets(int64_t chunk, const Tensor& state) const;
    // The span's document map over [first - lo_rows, first + c), or undefined without document masking.
    Tensor doc_map(int s, int64_t lo_rows) const;
    // The state tensor [B, HV, K, V] of the spans' scans, zero.
    Tensor zero_state(const Span& sp) const;
    // affine: the (h | M) of both spans [2, B, HV, K, V + K] (one scan each, from zero and the identity).
    Tensor affine_maps(const Span (&spans)[2]) const;
    // Start states of both spans into s_in_, and the state after the sequence into st.
    void affine_starts(const Span (&spans)[2], const Tensor& st);
    void relay_forward(const Span (&spans)[2], const Tensor& o, const Tensor& st);
    // One span's forward from s_in_[s] (its output rows into o), and backward with end-state gradient dst (undefined:
    // zero), its input gradients into the rows of grads (dq, dk, dv, dg, dbeta); returns its start state's gradient.
    Tensor span_forward(int s, const Span& sp, const Tensor& o) const;
    Tensor span_backward(
        int s, const Span& sp, const Tensor& d_o, const Tensor& dst, const std::array<Tensor, 5>& grads) const;
    // affine: every span's own start-state gradient (a reverse scan from a zero end gradient), all-gathered and
    // folded: the true end-state gradients of this rank's spans.
    // d_end: the last span's end gradient (undefined: zero); ds0: the first span's start-state gradient, written.
    std::array<Tensor, 2> affine_end_grads(const Span (&spans)[2],
                                           const Tensor& d_o,
                                           const Tensor& d_end,
                                           Tensor& ds0) const;

    ContextParallel cp_;
    int64_t halo_rows_ = 0;
    CpBatch batch_;
    parallel::Zigzag z_;
    int64_t rows_ = 0;
    core::Device device_ = core::Device::cpu;
    std::array<std::array<Tensor, 3>, 2> halo_, dhalo_;  // per span, per projection [B, W - 1, C]
    std::array<Tensor, 2> s_in_;                         // per span, the start state of the last forward
    Tensor carry_s0_;                                    // segments: the state and halo the segment continues from
    std::array<Tensor, 3> carry_halo_;
    Tensor maps_;  // affine: every span's (h | M), [cp, 2, B, HV, K, V + K] on the host, for the backward's fold
};

}  // namespace mt::nn
