// The parameter table: built once from the model config, the only place that decides per-tensor attributes
// (shape, init, weight decay, optimizer group; sharding comes later). Parameters and gradients each live in
// one contiguous arena, and every parameter is a named view into both.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace mt::nn {

using core::DType;
using core::Shape;
using core::Tensor;

enum class InitKind { normal, ones, zeros };
enum class OptimGroup { adamw };

struct ParamSpec {
    std::string name;  // canonical name, also the checkpoint key and the PyTorch reference's state_dict key
    Shape shape;
    InitKind init = InitKind::normal;
    double init_std = 0.02;
    bool weight_decay = true;
    OptimGroup group = OptimGroup::adamw;
};

class ParamTable {
   public:
    // Declares a parameter; returns its index. Only before finalize().
    int add(ParamSpec spec);
    // Allocates the parameter and gradient arenas (zeroed) in the given dtype.
    void finalize(DType dtype);
    // Fills parameters from their init spec; parameter i draws from Philox stream hash(name), so values do not
    // depend on declaration order or thread count.
    void initialize(uint64_t seed);
    void zero_grads();

    int size() const {
        return static_cast<int>(specs_.size());
    }
    const ParamSpec& spec(int i) const {
        return specs_.at(static_cast<size_t>(i));
    }
    int find(const std::string& name) const;  // -1 when absent
    Tensor param(int i) const {
        return params_.at(static_cast<size_t>(i));
    }
    Tensor grad(int i) const {
        return grads_.at(static_cast<size_t>(i));
    }
    int64_t offset(int i) const {
        return offsets_.at(static_cast<size_t>(i));
    }  // elements into the arenas
    int64_t total_numel() const {
        return total_;
    }
    DType dtype() const {
        return dtype_;
    }
    Tensor param_arena() const {
        return param_arena_;
    }
    Tensor grad_arena() const {
        return grad_arena_;
    }
    // A new arena of the same layout (optimizer state families use it), and parameter i's view into it.
    Tensor make_arena(DType dtype) const;
    Tensor view(const Tensor& arena, int i) const;

   private:
    std::vector<ParamSpec> specs_;
    std::unordered_map<std::string, int> index_;
    std::vector<int64_t> offsets_;
    std::vector<Tensor> params_, grads_;
    Tensor param_arena_, grad_arena_;
    int64_t total_ = 0;
    DType dtype_ = DType::f32;
    bool finalized_ = false;
};

}  // namespace mt::nn
