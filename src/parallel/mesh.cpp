// Mesh arithmetic (coordinates, groups, resolving the config's sizes) and the group communicators.
#include "parallel/mesh.h"

#include <fmt/format.h>

namespace mt::parallel {

namespace {

constexpr std::array<std::string_view, kMeshAxes> kAxisNames = {"tp", "cp", "ep", "dp", "pp"};

// The axes each group spans, as a bit mask over MeshAxis.
constexpr unsigned axis_bit(MeshAxis a) {
    return 1u << static_cast<unsigned>(a);
}
constexpr std::array<unsigned, kMeshGroups> kGroupAxes = {
    axis_bit(MeshAxis::tp),
    axis_bit(MeshAxis::cp),
    axis_bit(MeshAxis::ep),
    axis_bit(MeshAxis::dp),
    axis_bit(MeshAxis::pp),
    axis_bit(MeshAxis::cp) | axis_bit(MeshAxis::ep) | axis_bit(MeshAxis::dp),
    axis_bit(MeshAxis::cp) | axis_bit(MeshAxis::dp),
    axis_bit(MeshAxis::tp) | axis_bit(MeshAxis::cp) | axis_bit(MeshAxis::ep) | axis_bit(MeshAxis::dp),
    axis_bit(MeshAxis::tp) | axis_bit(MeshAxis::ep),
};

// The group's "name" in the world: the rank whose coordinates along the group's axes are 0.
int64_t group_color(const MeshShape& shape, int64_t rank, MeshGroup group) {
    MeshCoord c = mesh_coord(shape, rank);
    for (int a = 0; a < kMeshAxes; ++a)
        if (kGroupAxes[static_cast<size_t>(group)] & (1u << a)) c[static_cast<size_t>(a)] = 0;
    return mesh_rank(shape, c);
}

}  // namespace

int64_t MeshShape::world() const {
    int64_t w = 1;
    for (int64_t s : size) w *= s;
    return w;
}

std::string_view mesh_group_name(MeshGroup group) {
    static constexpr std::array<std::string_view, kMeshGroups> names = {
        "tp", "cp", "ep", "dp", "pp", "dp_span", "edp", "stage", "tp_ep"};
    return names[static_cast<size_t>(group)];
}

std::string mesh_describe(const MeshShape& shape) {
    std::string out;
    for (int a = 0; a < kMeshAxes; ++a)
        out += fmt::format("{}{}={}", a ? " " : "", kAxisNames[static_cast<size_t>(a)], shape.size[size_t(a)]);
    return out;
}

MeshShape mesh_resolve(const MeshRequest& r, int64_t world, const MeshModelInfo& model, const std::string& source) {
    auto bad = [&](const std::string& hint, const std::string& msg) {
        core::fail_hint(core::ExitCode::usage, hint, "{} [{}]", msg, source);
    };
    MeshShape s;
    s.size = {r.tp, r.cp, r.ep, r.dp, r.pp};
    for (int a = 0; a < kMeshAxes; ++a) {
        const int64_t v = s.size[static_cast<size_t>(a)];
        if (v < 1 && !(a == static_cast<int>(MeshAxis::dp) && v == 0))
            bad("each size is at least 1 (parallel.dp may be 0: the rest of the processes)",
                fmt::format("parallel.{} = {} is out of range", kAxisNames[static_cast<size_t>(a)], v));
    }
    if (r.ep > 1 && !model.moe)
        bad("set parallel.ep = 1 for a dense model",
            fmt::format("parallel.ep = {} needs an MoE model (moe.enabled = true)", r.ep));
    if (model.moe && model.num_experts % r.ep != 0)
        bad("every expert-parallel rank holds the same number of experts",
            fmt::format("moe.num_experts = {} is not divisible by parallel.ep = {}", model.num_experts, r.ep));
    const int64_t others = r.tp * r.cp * r.ep * r.pp;
    if (r.dp == 0) {
        if (world % others != 0)
            bad(fmt::format("launch a multiple of {} processes, or change the parallel sizes", others),
                fmt::format("parallel.tp x cp x ep x pp = {} x {} x {} x {} = {} does not divide the {} process{} of "
                            "this job, so parallel.dp = 0 cannot fill the rest",
                            r.tp,
                            r.cp,
                            r.ep,
                            r.pp,
                            others,
                            world,
                            world == 1 ? "" : "es"));
        s.size[static_cast<size_t>(MeshAxis::dp)] = world / others;
    }
    if (s.world() != world)
        bad(fmt::format(
                "launch {} processes (mpirun -np {}), or set parallel.dp = 0 to fill the world", s.world(), s.world()),
            fmt::format("parallel.tp x cp x ep x dp x pp = {} = {}, but the job has {} process{}",
                        fmt::join(s.size, " x "),
                        s.world(),
                        world,
                        world == 1 ? "" : "es"));
    return s;
}

MeshCoord mesh_coord(const MeshShape& shape, int64_t rank) {
    MT_CHECK(rank >= 0 && rank < shape.world(), "rank {} outside a mesh of {}", rank, shape.world());
    MeshCoord c{};
    for (int a = 0; a < kMeshAxes; ++a) {
        c[static_cast<size_t>(a)] = rank % shape.size[static_cast<size_t>(a)];
        rank /= shape.size[static_cast<size_t>(a)];
    }
    return c;
}

int64_t mesh_rank(const MeshShape& shape, const MeshCoord& coord) {
    int64_t rank = 0;
    for (int a = kMeshAxes - 1; a >= 0; --a) {
        const auto i = static_cast<size_t>(a);
        MT_CHECK(coord[i] >= 0 && coord[i] < shape.size[i], "coordinate {} outside axis {}", coord[i], kAxisNames[i]);
        rank = rank * shape.size[i] + coord[i];
    }
    return rank;
}

std::vector<int64_t> mesh_group_ranks(const MeshShape& shape, int64_t rank, MeshGroup group) {
    const int64_t color = group_color(shape, rank, group);
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < shape.world(); ++r)
        if (group_color(shape, r, group) == color) ranks.push_back(r);
    return ranks;
}

Mesh::Mesh(Comm& world, const MeshShape& shape) : world_(&world), shape_(shape) {
    MT_CHECK(world.size() == shape.world(), "mesh of {} ranks over a world of {}", shape.world(), world.size());
    coord_ = mesh_coord(shape, world.rank());
    for (int g = 0; g < kMeshGroups; ++g) {
        const int64_t color = group_color(shape, world.rank(), static_cast<MeshGroup>(g));
        groups_[static_cast<size_t>(g)] = world.split(static_cast<int>(color), world.rank());
    }
}

nlohmann::json Mesh::to_json() const {
    nlohmann::json j = {{"order", "tp-cp-ep-dp-pp"}};
    for (int a = 0; a < kMeshAxes; ++a) j[std::string(kAxisNames[size_t(a)])] = shape_.size[size_t(a)];
    j["world"] = shape_.world();
    return j;
}

MeshShape mesh_shape_from_json(const nlohmann::json& j) {
    MeshShape s;
    for (int a = 0; a < kMeshAxes; ++a) s.size[size_t(a)] = j.value(std::string(kAxisNames[size_t(a)]), int64_t{1});
    return s;
}

}  // namespace mt::parallel
