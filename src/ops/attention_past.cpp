// Entry points of attention over a past key block (ring context parallelism): shape checks, then the kernel.
#include "ops/attention_past.h"

#include <string_view>

#include "ops/registry.h"

namespace mt::ops {

namespace {

// q [B, T, Hq, D]; k, v [B, Tk, Hkv, D], Hq % Hkv == 0; first [B, T] i32 or undefined; out like q; lse [B, Hq, T].
void check_past(const Tensor& q,
                const Tensor& k,
                const Tensor& v,
                const Tensor& first,
                const Tensor& out,
                const Tensor& lse,
                std::string_view op) {
    check_arg(q, op, "q", 4);
    check_arg(k, op, "k", 4);
    const int64_t b = q.size(0), t = q.size(1), hq = q.size(2), d = q.size(3), hkv = k.size(2);
    MT_CHECK(k.size(0) == b && k.size(3) == d && hkv > 0 && hq % hkv == 0,
             "{}: q {} and k {} must be [B, T, Hq, D] and [B, Tk, Hkv, D] with Hq a multiple of Hkv",
             op,
             core::shape_str(q.shape()),
             core::shape_str(k.shape()));
    check_arg(v, op, "v", 4);
    check_shape(v, k.shape(), op, "v");
    if (first.defined()) {
        check_arg(first, op, "first", 2);
        check_shape(first, {b, t}, op, "first");
        MT_CHECK(first.dtype() == core::DType::i32, "{}: first must be i32", op);
    }
    check_arg(out, op, "out", 4);
    check_shape(out, q.shape(), op, "out");
    check_arg(lse, op, "lse", 3);
    check_shape(lse, {b, hq, t}, op, "lse");
}

}  // namespace

void attention_past_fwd(const Tensor& q,
                        const Tensor& k,
                        const Tensor& v,
                        const Tensor& first,
                        const Tensor& out,
                        const Tensor& lse,
                        const Tensor& max_logit) {
    constexpr std::string_view op = "attention_past_fwd";
    const core::Device device = check_same_device(
        op, {{"q", q}, {"k", k}, {"v", v}, {"first", first}, {"out", out}, {"lse", lse}, {"max_logit", max_logit}});
    check_past(q, k, v, first, out, lse, op);
    if (max_logit.defined()) {
        check_arg(max_logit, op, "max_logit", 3);
        check_shape(max_logit, lse.shape(), op, "max_logit");
    }
    MT_CALL_KERNEL(attention_past_fwd, device, q, k, v, first, out, lse, max_logit);
}

void attention_past_bwd(const Tensor& q,
                        const Tensor& k,
                        const Tensor& v,
                        const Tensor& first,
                        const Tensor& out,
                        const Tensor& lse,
                        const Tensor& dout,
                        const Tensor& dq,
                        const Tensor& dk,
                        const Tensor& dv) {
    constexpr std::string_view op = "attention_past_bwd";
    const core::Device device = check_same_device(op,
                                                  {{"q", q},
                                                   {"k", k},
                                                   {"v", v},
                                                   {"first", first},
                                                   {"out", out},
                                                   {"lse", lse},
                                                   {"dout", dout},
                                                   {"dq", dq},
                                                   {"dk", dk},
                                                   {"dv", dv}});
    check_past(q, k, v, first, out, lse, op);
    for (const NamedArg& a : {NamedArg{"dout", dout}, NamedArg{"dq", dq}}) {
        check_arg(a.tensor, op, a.name, 4);
        check_shape(a.tensor, q.shape(), op, a.name);
    }
    for (const NamedArg& a : {NamedArg{"dk", dk}, NamedArg{"dv", dv}}) {
        check_arg(a.tensor, op, a.name, 4);
        check_shape(a.tensor, k.shape(), op, a.name);
    }
    MT_CALL_KERNEL(attention_past_bwd, device, q, k, v, first, out, lse, dout, dq, dk, dv);
}

}  // namespace mt::ops
