// Entry points of the embedding op: argument checks, the id range check (an input-data error), dispatch by device.
#include "ops/embedding.h"

#include "ops/cpu/checks.h"
#include "ops/cpu/kernels.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops {

namespace {

// Every id must index a row of the table; a bad id means bad token data (exit 3), not a bug. (The CUDA side checks
// on the device and reports the same message.)
void check_ids(const Tensor& ids, int64_t vocab, std::string_view op) {
    const int32_t* p = ids.data<int32_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) {
        if (p[i] < 0 || p[i] >= vocab)
            core::fail_hint(core::ExitCode::data,
                            "the token data holds ids outside the vocabulary; check model.vocab_size and the "
                            "tokenizer used to write the data",
                            "{}: ids[{}] = {} is outside the embedding table [0, {})",
                            op,
                            i,
                            p[i],
                            vocab);
    }
}

}  // namespace

void embedding_fwd(const Tensor& ids, const Tensor& weight, const Tensor& out) {
    constexpr std::string_view op = "embedding_fwd";
    cpu::check_i32_arg(ids, op, "ids", 1);
    check_arg(weight, op, "weight", 2);
    check_arg(out, op, "out", 2);
    const int64_t n = ids.size(0), vocab = weight.size(0), c = weight.size(1);
    check_shape(out, {n, c}, op, "out");
    if (check_same_device(op, {{"ids", ids}, {"weight", weight}, {"out", out}}) == core::Device::cuda)
        return cuda::embedding_fwd(ids, weight, out);
    check_float_arg(weight, op, "weight", 2);
    check_float_arg(out, op, "out", 2);
    cpu::check_dtype_as(out, weight, op, "out", "weight");
    check_ids(ids, vocab, op);
    MT_DISPATCH_FLOAT(weight.dtype(),
                      op,
                      cpu::embedding_fwd(ids.data<int32_t>(), weight.data<scalar_t>(), out.data<scalar_t>(), n, c));
}

void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dweight) {
    constexpr std::string_view op = "embedding_bwd";
    cpu::check_i32_arg(ids, op, "ids", 1);
    check_arg(dout, op, "dout", 2);
    check_arg(dweight, op, "dweight", 2);
    const int64_t n = ids.size(0), vocab = dweight.size(0), c = dweight.size(1);
    check_shape(dout, {n, c}, op, "dout");
    if (check_same_device(op, {{"ids", ids}, {"dout", dout}, {"dweight", dweight}}) == core::Device::cuda)
        return cuda::embedding_bwd(ids, dout, dweight);
    check_float_arg(dout, op, "dout", 2);
    check_float_arg(dweight, op, "dweight", 2);
    cpu::check_dtype_as(dweight, dout, op, "dweight", "dout");
    check_ids(ids, vocab, op);
    MT_DISPATCH_FLOAT(dout.dtype(),
                      op,
                      cpu::embedding_bwd(ids.data<int32_t>(), dout.data<scalar_t>(), dweight.data<scalar_t>(), n, c));
}

}  // namespace mt::ops
