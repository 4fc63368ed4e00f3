// CPU reference of the residual add and its accumulating backward, elementwise over flat buffers.
#include "ops/add.h"

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kBlock = 16384;  // elements per parallel task
}

// out = a + b; out may alias a or b (each element is read before it is written).
template <typename T>
void add_fwd(const T* a, const T* b, T* out, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kBlock + kBlock < n ? blk * kBlock + kBlock : n;
        for (int64_t i = blk * kBlock; i < end; ++i) out[i] = a[i] + b[i];
    }
}

// da += dout; db += dout
template <typename T>
void add_bwd(const T* dout, T* da, T* db, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kBlock + kBlock < n ? blk * kBlock + kBlock : n;
        for (int64_t i = blk * kBlock; i < end; ++i) {
            da[i] += dout[i];
            db[i] += dout[i];
        }
    }
}

template void add_fwd<float>(const float*, const float*, float*, int64_t);
template void add_fwd<double>(const double*, const double*, double*, int64_t);
template void add_bwd<float>(const float*, float*, float*, int64_t);
template void add_bwd<double>(const double*, double*, double*, int64_t);

// The CPU kernel of ops::add_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void add_fwd(const Tensor& a, const Tensor& b, const Tensor& out) {
    constexpr std::string_view op = "add_fwd";
    check_float_arg(a, op, "a", a.ndim());
    check_float_arg(b, op, "b", a.ndim());
    check_float_arg(out, op, "out", a.ndim());
    check_dtype_as(b, a, op, "b", "a");
    check_dtype_as(out, a, op, "out", "a");
    MT_DISPATCH_FLOAT(
        a.dtype(), op, cpu::add_fwd(a.data<scalar_t>(), b.data<scalar_t>(), out.data<scalar_t>(), a.numel()));
}
MT_REGISTER_KERNEL(add_fwd, cpu, add_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::add_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void add_bwd(const Tensor& dout, const Tensor& da, const Tensor& db) {
    constexpr std::string_view op = "add_bwd";
    check_float_arg(dout, op, "dout", dout.ndim());
    check_float_arg(da, op, "da", dout.ndim());
    check_float_arg(db, op, "db", dout.ndim());
    check_dtype_as(da, dout, op, "da", "dout");
    check_dtype_as(db, dout, op, "db", "dout");
    MT_DISPATCH_FLOAT(
        dout.dtype(), op, cpu::add_bwd(dout.data<scalar_t>(), da.data<scalar_t>(), db.data<scalar_t>(), dout.numel()));
}
MT_REGISTER_KERNEL(add_bwd, cpu, add_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
