// Where a model runs and in which dtypes: activations (compute), saved statistics (RMSNorm rstd, attention and
// loss log-sum-exp), the weights the forward reads, the fp32 master weights and the gradients.
//   CPU f32 (and f64 for gradient checks): everything in one dtype, no master copy.
//   CUDA mixed precision: bf16 activations and weights, f32 statistics, f32 master weights, f32 gradients and
//   optimizer state (as Megatron-LM's bf16 training). fp16 is the same with f16 in place of bf16; it needs loss
//   scaling (optim/loss_scaler.h). CUDA f32 (everything f32) is for debugging.
#pragma once

#include "core/dtype.h"

namespace mt::nn {

struct Precision {
    core::Device device = core::Device::cpu;
    core::DType compute = core::DType::f32;  // activations and their gradients
    core::DType stats = core::DType::f32;    // rstd, lse, per-row losses
    core::DType param = core::DType::f32;    // the weights the forward reads
    core::DType master = core::DType::f32;   // what the optimizer updates, gradients, optimizer state
    // Optimizer offload (optim.offload = "cpu"): the master weights live in pinned host memory, a copy apart from
    // the forward's weights even where the dtypes agree; the gradients stay on the device.
    bool master_on_host = false;

    bool has_master_copy() const {
        return param != master || master_on_host;
    }
    // One dtype everywhere on the CPU (f32 for training, f64 for gradient checks).
    static Precision cpu(core::DType dtype) {
        return {core::Device::cpu, dtype, dtype, dtype, dtype, false};
    }
    // bf16 mixed precision on a GPU.
    static Precision cuda_bf16() {
        return cuda_mixed(core::DType::bf16);
    }
    // bf16 or f16 activations and weights with f32 statistics, master weights, gradients and optimizer state.
    static Precision cuda_mixed(core::DType half) {
        return {core::Device::cuda, half, core::DType::f32, half, core::DType::f32, false};
    }
    static Precision cuda_f32() {
        return {core::Device::cuda, core::DType::f32, core::DType::f32, core::DType::f32, core::DType::f32, false};
    }
};

}  // namespace mt::nn
