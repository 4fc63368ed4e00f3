// Entry points of the global-token and sink merge of attention: shape checks, then the CPU reference or the CUDA
// kernels (each checks its own dtypes).
#include "ops/attention_global.h"

#include <string_view>

#include "core/backend.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// q [B, T, Hq, D]; kg, vg [G, Hkv, D] both or neither, G >= 1, Hq % Hkv == 0; sink [Hq] or undefined; out like q;
// lse [B, Hq, T]; at least one of the global keys and the sink.
void check_global(const Tensor& q,
                  const Tensor& kg,
                  const Tensor& vg,
                  const Tensor& sink,
                  const Tensor& out,
                  const Tensor& lse,
                  std::string_view op) {
    check_arg(q, op, "q", 4);
    const int64_t b = q.size(0), t = q.size(1), hq = q.size(2), d = q.size(3);
    MT_CHECK(kg.defined() == vg.defined(), "{}: kg and vg must be both defined or both undefined", op);
    MT_CHECK(kg.defined() || sink.defined(), "{}: neither global keys (kg, vg) nor a sink: nothing to merge", op);
    if (kg.defined()) {
        check_arg(kg, op, "kg", 3);
        const int64_t g = kg.size(0), hkv = kg.size(1);
        MT_CHECK(g >= 1, "{}: kg has shape {}; at least one global token", op, core::shape_str(kg.shape()));
        MT_CHECK(
            hkv > 0 && hq % hkv == 0, "{}: q has {} heads and kg has {}; Hq must be a multiple of Hkv", op, hq, hkv);
        check_shape(kg, {g, hkv, d}, op, "kg");
        check_arg(vg, op, "vg", 3);
        check_shape(vg, {g, hkv, d}, op, "vg");
    }
    if (sink.defined()) {
        check_arg(sink, op, "sink", 1);
        check_shape(sink, {hq}, op, "sink");
    }
    check_arg(out, op, "out", 4);
    check_shape(out, q.shape(), op, "out");
    check_arg(lse, op, "lse", 3);
    check_shape(lse, {b, hq, t}, op, "lse");
}

}  // namespace

void attention_global_fwd(
    const Tensor& q, const Tensor& kg, const Tensor& vg, const Tensor& sink, const Tensor& out, const Tensor& lse) {
    constexpr std::string_view op = "attention_global_fwd";
    const core::Device device =
        check_same_device(op, {{"q", q}, {"kg", kg}, {"vg", vg}, {"sink", sink}, {"out", out}, {"lse", lse}});
    check_global(q, kg, vg, sink, out, lse, op);
    MT_CALL_KERNEL(attention_global_fwd, device, q, kg, vg, sink, out, lse);
}

void attention_global_bwd(const Tensor& q,
                          const Tensor& kg,
                          const Tensor& vg,
                          const Tensor& sink,
                          const Tensor& out,
                          const Tensor& lse,
                          const Tensor& dout,
                          const Tensor& dq,
                          const Tensor& dkg,
                          const Tensor& dvg,
                          const Tensor& dsink) {
    constexpr std::string_view op = "attention_global_bwd";
    const core::Device device = check_same_device(op,
                                                  {{"q", q},
                                                   {"kg", kg},
                                                   {"vg", vg},
                                                   {"sink", sink},
                                                   {"out", out},
                                                   {"lse", lse},
                                                   {"dout", dout},
                                                   {"dq", dq},
                                                   {"dkg", dkg},
                                                   {"dvg", dvg},
                                                   {"dsink", dsink}});
    check_global(q, kg, vg, sink, out, lse, op);
    for (const NamedArg& a : {NamedArg{"dout", dout}, NamedArg{"dq", dq}}) {
        check_arg(a.tensor, op, a.name, 4);
        check_shape(a.tensor, q.shape(), op, a.name);
    }
    MT_CHECK(dkg.defined() == kg.defined() && dvg.defined() == kg.defined(),
             "{}: dkg and dvg must be given exactly when kg is",
             op);
    if (kg.defined()) {
        check_arg(dkg, op, "dkg", 3);
        check_shape(dkg, kg.shape(), op, "dkg");
        check_arg(dvg, op, "dvg", 3);
        check_shape(dvg, kg.shape(), op, "dvg");
    }
    MT_CHECK(dsink.defined() == sink.defined(), "{}: dsink must be given exactly when sink is", op);
    if (sink.defined()) {
        check_arg(dsink, op, "dsink", 1);
        check_shape(dsink, sink.shape(), op, "dsink");
    }
    MT_CALL_KERNEL(attention_global_bwd, device, q, kg, vg, sink, out, lse, dout, dq, dkg, dvg, dsink);
}

}  // namespace mt::ops
