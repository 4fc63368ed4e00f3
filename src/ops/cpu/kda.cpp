// The CPU references of ops/kda.h (kda_recurrent.cpp, kda_chunked.cpp) behind the op registry: the CPU dtypes (every
// tensor f32 or f64, all of q's dtype), then the algorithm the options name. Shapes were checked by ops/kda.cpp.
#include "ops/kda.h"

#include "ops/cpu/checks.h"
#include "ops/cpu/kda.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

KdaDims dims_of(const Tensor& q, const Tensor& v) {
    return {q.size(0), q.size(1), q.size(2), v.size(2), q.size(3), v.size(3)};
}

void check_cpu_dtypes(std::initializer_list<NamedArg> args, const Tensor& q, std::string_view op) {
    for (const NamedArg& a : args) {
        if (!a.tensor.defined()) continue;
        check_float_arg(a.tensor, op, a.name, static_cast<int>(a.tensor.ndim()));
        check_dtype_as(a.tensor, q, op, a.name, "q");
    }
}

template <typename T>
const T* ptr_or_null(const Tensor& t) {
    return t.defined() ? t.data<T>() : nullptr;
}

template <typename T>
T* mut_ptr_or_null(const Tensor& t) {
    return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

void kda_fwd(const Tensor& q,
             const Tensor& k,
             const Tensor& v,
             const Tensor& g,
             const Tensor& beta,
             const Tensor& s0,
             const Tensor& out,
             const Tensor& st,
             const KdaOptions& options,
             KdaSaved* saved) {
    constexpr std::string_view op = "kda_fwd";
    const KdaDims d = dims_of(q, v);
    check_cpu_dtypes(
        {{"q", q}, {"k", k}, {"v", v}, {"g", g}, {"beta", beta}, {"s0", s0}, {"out", out}, {"st", st}}, q, op);
    const bool chunked = options.algorithm == KdaAlgorithm::chunked;
    const bool pairwise = options.diagonal == KdaDiagonal::pairwise;
    const int32_t* reset = options.chunk_reset.defined() ? options.chunk_reset.data<int32_t>() : nullptr;
    MT_DISPATCH_FLOAT(q.dtype(), op, {
        const scalar_t* args[] = {
            q.data<scalar_t>(), k.data<scalar_t>(), v.data<scalar_t>(), g.data<scalar_t>(), beta.data<scalar_t>()};
        if (chunked) {
            kda_chunked_fwd(args[0],
                            args[1],
                            args[2],
                            args[3],
                            args[4],
                            ptr_or_null<scalar_t>(s0),
                            out.data<scalar_t>(),
                            mut_ptr_or_null<scalar_t>(st),
                            d,
                            options.chunk_size,
                            pairwise,
                            reset);
        } else {
            kda_recurrent_fwd(args[0],
                              args[1],
                              args[2],
                              args[3],
                              args[4],
                              ptr_or_null<scalar_t>(s0),
                              out.data<scalar_t>(),
                              mut_ptr_or_null<scalar_t>(st),
                              d);
        }
    });
}
MT_REGISTER_KERNEL(kda_fwd, cpu, kda_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::kda_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void kda_bwd(const Tensor& q,
             const Tensor& k,
             const Tensor& v,
             const Tensor& g,
             const Tensor& beta,
             const Tensor& s0,
             const Tensor& dout,
             const Tensor& dst,
             const Tensor& dq,
             const Tensor& dk,
             const Tensor& dv,
             const Tensor& dg,
             const Tensor& dbeta,
             const Tensor& ds0,
             const KdaOptions& options,
             const KdaSaved* saved) {
    constexpr std::string_view op = "kda_bwd";
    const KdaDims d = dims_of(q, v);
    check_cpu_dtypes({{"q", q},
                      {"k", k},
                      {"v", v},
                      {"g", g},
                      {"beta", beta},
                      {"s0", s0},
                      {"dout", dout},
                      {"dst", dst},
                      {"dq", dq},
                      {"dk", dk},
                      {"dv", dv},
                      {"dg", dg},
                      {"dbeta", dbeta},
                      {"ds0", ds0}},
                     q,
                     op);
    const bool chunked = options.algorithm == KdaAlgorithm::chunked;
    const bool pairwise = options.diagonal == KdaDiagonal::pairwise;
    const int32_t* reset = options.chunk_reset.defined() ? options.chunk_reset.data<int32_t>() : nullptr;
    MT_DISPATCH_FLOAT(q.dtype(), op, {
        const scalar_t* in[] = {q.data<scalar_t>(),
                                k.data<scalar_t>(),
                                v.data<scalar_t>(),
                                g.data<scalar_t>(),
                                beta.data<scalar_t>(),
                                ptr_or_null<scalar_t>(s0),
                                dout.data<scalar_t>(),
                                ptr_or_null<scalar_t>(dst)};
        scalar_t* grads[] = {dq.data<scalar_t>(),
                             dk.data<scalar_t>(),
                             dv.data<scalar_t>(),
                             dg.data<scalar_t>(),
                             dbeta.data<scalar_t>(),
                             mut_ptr_or_null<scalar_t>(ds0)};
        if (chunked) {
            kda_chunked_bwd(in[0],
                            in[1],
                            in[2],
                            in[3],
                            in[4],
                            in[5],
                            in[6],
                            in[7],
                            grads[0],
                            grads[1],
                            grads[2],
                            grads[3],
                            grads[4],
                            grads[5],
                            d,
                            options.chunk_size,
                            pairwise,
                            reset);
        } else {
            kda_recurrent_bwd(in[0],
                              in[1],
                              in[2],
                              in[3],
                              in[4],
                              in[5],
                              in[6],
                              in[7],
                              grads[0],
                              grads[1],
                              grads[2],
                              grads[3],
                              grads[4],
                              grads[5],
                              d);
        }
    });
}
MT_REGISTER_KERNEL(kda_bwd, cpu, kda_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
