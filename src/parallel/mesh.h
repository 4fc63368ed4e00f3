// The device mesh: the job's processes as a 5-D grid of tensor (tp), context (cp), expert (ep), data (dp) and
// pipeline (pp) parallelism, rank order tp-cp-ep-dp-pp with tp fastest (as Megatron-Core), and one communicator per
// group of ranks that differ only along some axes. The arithmetic is pure (tested without MPI); Mesh splits the
// world communicator.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace mt::parallel {

enum class MeshAxis : uint8_t { tp, cp, ep, dp, pp };
constexpr int kMeshAxes = 5;

// Sizes per axis, indexed by MeshAxis.
struct MeshShape {
    std::array<int64_t, kMeshAxes> size{1, 1, 1, 1, 1};
    int64_t operator[](MeshAxis a) const {
        return size[static_cast<size_t>(a)];
    }
    int64_t world() const;
    bool operator==(const MeshShape&) const = default;
};

// A rank's position along each axis, indexed by MeshAxis.
using MeshCoord = std::array<int64_t, kMeshAxes>;

// The sizes a job config asks for: [parallel] tp, cp, ep, dp, pp; dp = 0 means "the rest of the world"
// (world / (tp cp ep pp)).
struct MeshRequest {
    int64_t tp = 1, cp = 1, ep = 1, dp = 0, pp = 1;
};

// What the mesh must fit in the model: experts are partitioned over ep.
struct MeshModelInfo {
    bool moe = false;
    int64_t num_experts = 0;
};

// Resolves a request against the number of processes. Impossible layouts end with exit 2 naming the keys: a
// product that differs from the world size, dp = 0 when the other axes do not divide it, ep > 1 without MoE,
// experts not divisible by ep.
// @param[in] source  the config file, for messages
MeshShape mesh_resolve(const MeshRequest& request,
                       int64_t world,
                       const MeshModelInfo& model,
                       const std::string& source);

// rank = tp + TP (cp + CP (ep + EP (dp + DP pp))).
MeshCoord mesh_coord(const MeshShape& shape, int64_t rank);
int64_t mesh_rank(const MeshShape& shape, const MeshCoord& coord);

// Groups of ranks that share every coordinate except those of the named axes. dp_span is cp x ep x dp (the ranks
// that see different tokens of one pipeline stage and tensor shard: dense gradients and MoE histograms are
// reduced over it); edp is cp x dp (ranks holding the same experts: expert gradients are reduced over it); stage is
// tp x cp x ep x dp, every rank of one pipeline stage (the gradients each tp rank holds a part of are reduced over
// it: dp_span x tp); tp_ep is tp x ep, the ranks an MoE layer's routed experts are spread over (under tensor
// parallelism the tp ranks act as further expert-parallel ranks, Megatron-Core's MoE parallel folding).
enum class MeshGroup : uint8_t { tp, cp, ep, dp, pp, dp_span, edp, stage, tp_ep };
constexpr int kMeshGroups = 9;
std::string_view mesh_group_name(MeshGroup group);

// The global ranks of `rank`'s group, ascending (position in the list = rank in the group's communicator).
std::vector<int64_t> mesh_group_ranks(const MeshShape& shape, int64_t rank, MeshGroup group);

class Mesh {
   public:
    // Splits `world` into every group's communicator (collective over world). world.size() must equal
    // shape.world(). The Mesh keeps a reference to world.
    Mesh(Comm& world, const MeshShape& shape);

    const MeshShape& shape() const {
        return shape_;
    }
    const MeshCoord& coord() const {
        return coord_;
    }
    int64_t coord(MeshAxis a) const {
        return coord_[static_cast<size_t>(a)];
    }
    int64_t size(MeshAxis a) const {
        return shape_[a];
    }
    Comm& world() const {
        return *world_;
    }
    Comm& group(MeshGroup g) const {
        return *groups_[static_cast<size_t>(g)];
    }
    // The manifest's and the metrics' record: {"order": "tp-cp-ep-dp-pp", "tp": .., ..., "world": ..}.
    nlohmann::json to_json() const;

   private:
    Comm* world_;
    MeshShape shape_;
    MeshCoord coord_{};
    std::array<std::unique_ptr<Comm>, kMeshGroups> groups_;
};

// The shape a manifest's "mesh" object records (missing axes are 1).
MeshShape mesh_shape_from_json(const nlohmann::json& j);
std::string mesh_describe(const MeshShape& shape);  // "tp=1 cp=1 ep=2 dp=2 pp=1"

}  // namespace mt::parallel
