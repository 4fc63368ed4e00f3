// GradNorm's measurement (loss.weighting = "gradnorm"; multimodal.md §5, Chen et al., arXiv:1711.02257): for each
// source i of the step, G_i = ||grad_W (w_i C_i / N)||_2 on one shared weight W, from one extra forward and backward
// of every micro-batch with only source i's rows weighted. The weight update from these norms is LossWeighting's.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/model.h"

namespace mt::train {

// The parameter GradNorm measures: `name` (loss.gradnorm_layer) when set, else the down projection of the last
// layer's shared expert (`layers.<L-1>.moe.shared.w_down.weight`), which every token passes; a model without one takes
// the last layer's dense MLP (`layers.<L-1>.mlp.w_down.weight`), then its routed experts' (`layers.<L-1>.moe.experts.
// w_down`). Exit 2 naming loss.gradnorm_layer when the name is not a parameter of the model.
int gradnorm_param(const nn::ParamTable& table, int64_t n_layers, const std::string& name);

// G_i for every source, in the model's current state. Zeroes the parameter gradients before each source's backward
// and leaves them zero (the step's own backward follows) and the model's row weights empty.
// @param[in] micro_batches  the step's micro-batches
// @param[in] micro          micro-batch m's (inputs, targets) [B, T] i32, after setting whatever else its forward
//                           needs (the images)
// @param[in] sources        micro-batch m's row sources, [B] each
// @param[in] weights        w_i
// @param[in] n_global       N, the step's supervised tokens over every micro-batch and rank
// @param[in] loss_scale     the backward's loss scale (divided out of the norms)
// @param[in] reduce         sums W's gradient (f64, host) over the data-parallel ranks in place
std::vector<double> gradnorm_grad_norms(nn::Model& model,
                                        int param,
                                        int64_t micro_batches,
                                        const std::function<std::pair<core::Tensor, core::Tensor>(int64_t)>& micro,
                                        const std::vector<std::vector<int32_t>>& sources,
                                        const std::vector<double>& weights,
                                        double n_global,
                                        double loss_scale,
                                        const std::function<void(core::Tensor&)>& reduce);

}  // namespace mt::train
