// Helpers that the checkpoint's write (trainer_checkpoint.cpp) and its load (trainer_resume.cpp) share.
#pragma once

#include <array>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/model_config.h"
#include "nn/param_table.h"
#include "optim/adamw.h"
#include "train/checkpoint_io.h"
#include "train/config.h"

namespace mt::train::checkpoint_parts {

// Every tensor of the whole model at its global shape, whatever part of it this rank holds (a pipeline stage holds
// only its layers): the checkpoint's signature is the model's, not the layout's.
std::vector<TensorSpec> model_specs(const nn::ModelConfig& model, const nn::ParamTable& table);
// run.dir/checkpoints.
std::string checkpoints_root(const JobConfig& cfg);
// t itself on the CPU, else a host copy (checkpoints hold host copies, so they move between devices).
core::Tensor to_host(const core::Tensor& t);
// t viewed as 1-D.
core::Tensor flat(const core::Tensor& t);
// A piece's two AdamW moments with their checkpoint kinds.
std::array<std::pair<const char*, core::Tensor>, 2> moments(const optim::AdamW& adamw, const optim::AdamW::Piece& p);

}  // namespace mt::train::checkpoint_parts
