// Tensor-parallel shards of parameters and the collectives at the edges of the tensor-parallel regions.
#include "nn/tensor_parallel.h"

#include "parallel/comm.h"

namespace mt::nn {

parallel::Comm& TensorParallel::rows() const {
    MT_CHECK(comm != nullptr, "tensor parallelism of size {} without a communicator", size);
    return rows_comm != nullptr ? *rows_comm : *comm;
}

ParamSpec tp_split(ParamSpec spec, const TensorParallel& tp, int axis) {
    if (!tp.active()) return spec;
    const auto a = static_cast<size_t>(axis);
    MT_CHECK(
        a < spec.shape.size(), "parameter {}: tp split along dimension {} of {}", spec.name, axis, spec.shape.size());
    const int64_t global = spec.shape[a];
    spec.tp_axis = axis;
    spec.tp_global = global;
    spec.tp_first = tp.shard_first(global);
    spec.shape[a] = tp.shard(global);
    return spec;
}

ParamSpec tp_split_replicated(ParamSpec spec, const TensorParallel& tp, int axis, int64_t parts) {
    if (!tp.active() || tp.size <= parts) return tp_split(std::move(spec), tp, axis);
    MT_CHECK(tp.size % parts == 0, "parameter {}: {} tp ranks over {} replicated shards", spec.name, tp.size, parts);
    const auto a = static_cast<size_t>(axis);
    const int64_t global = spec.shape.at(a), replicas = tp.size / parts, local = global / parts;
    spec.tp_axis = axis;
    spec.tp_global = global;
    spec.tp_first = tp.rank / replicas * local;
    spec.tp_replicas = replicas;
    spec.shape[a] = local;
    return spec;
}

ParamSpec tp_partial(ParamSpec spec, const TensorParallel& tp) {
    spec.tp_partial_grad = tp.active();
    return spec;
}

void tp_gather_rows(const TensorParallel& tp, const core::Tensor& local, const core::Tensor& full) {
    if (tp.splits_rows()) tp_gather_own_rows(tp, local, full);
}

core::Tensor tp_own_rows(const TensorParallel& tp, const core::Tensor& full) {
    const int64_t n = full.size(0) / tp.size;
    return tp.active() ? full.slice(0, tp.rank * n, (tp.rank + 1) * n) : full;
}

void tp_gather_own_rows(const TensorParallel& tp, const core::Tensor& local, const core::Tensor& full) {
    if (!tp.active()) return;
    MT_CHECK(full.size(0) == local.size(0) * tp.size, "tp all-gather of {} rows into {}", local.size(0), full.size(0));
    MT_CHECK(local.is_contiguous() && full.is_contiguous() && local.dtype() == full.dtype(), "tp all-gather operands");
    // A gather only moves data: bytes, any dtype.
    const int64_t bytes = local.numel() * static_cast<int64_t>(core::dtype_size(local.dtype()));
    tp.rows().all_gather(local.raw(), full.raw(), bytes, parallel::CommType::u8).wait_on_device();
}

void tp_sum_rows(const TensorParallel& tp, const core::Tensor& full, const core::Tensor& local) {
    if (!tp.active()) return;
    MT_CHECK(local.is_contiguous() && full.is_contiguous() && local.dtype() == full.dtype(), "tp reduction operands");
    const parallel::CommType type = parallel::comm_type_of(full.dtype());
    if (tp.splits_rows()) {
        MT_CHECK(full.size(0) == local.size(0) * tp.size,
                 "tp reduce-scatter of {} rows into {}",
                 full.size(0),
                 local.size(0));
        tp.rows()
            .reduce_scatter(full.raw(), local.raw(), local.numel(), type, parallel::ReduceOp::sum)
            .wait_on_device();
        return;
    }
    tp.rows().all_reduce(full.raw(), full.numel(), type, parallel::ReduceOp::sum).wait_on_device();
    if (local.raw() != full.raw()) local.copy_from(full);
}

}  // namespace mt::nn
