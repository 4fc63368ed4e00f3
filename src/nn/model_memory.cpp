// The model's memory accounting: the activations it holds for the backward and its backward workspace, the figures
// the memory planner (parallel/plan_memory.h) is checked against.
#include "nn/model.h"

namespace mt::nn {

std::vector<SavedTensor> Model::saved_for_backward() {
    std::vector<SavedTensor> saved = {{"embed_out", &x0_},
                                      {"final_norm", &final_},
                                      {"final_rstd", &final_rstd_},
                                      {"logits", &logits_},
                                      {"lse", &lse_}};
    if (final_full_.defined()) saved.push_back({"final_norm_gathered", &final_full_});
    if (attnres_)
        for (auto& s : attnres_->saved_for_backward()) saved.push_back({"attnres." + s.name, s.tensor});
    return saved;
}

size_t Model::saved_activation_bytes() {
    size_t bytes = saved_bytes(saved_for_backward());
    for (auto& b : blocks_)
        bytes += saved_bytes(b->saved_for_backward()) + (b->output().defined() ? b->output().nbytes() : 0);
    // The vision tower's, as allocated: its buffers keep the size of the largest image batch so far.
    if (vision_) bytes += static_cast<size_t>(vision_->saved_activation_bytes());
    return bytes;
}

size_t Model::workspace_bytes() const {
    size_t bytes = ws_.slot_bytes();
    for (const Tensor* t : {&ws_.d_norm, &ws_.d_tmp}) bytes += t->defined() ? t->nbytes() : 0;
    return bytes;
}

}  // namespace mt::nn
