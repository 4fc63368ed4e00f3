// Trainer <-> communication accounting: this rank's bytes, calls and host seconds per report group (tp, cp, ep, dp,
// pp, world), summed over every communicator of the group, MPI and NCCL, and the train line's comm/<group>/* fields
// for the last step (docs/distributed.md "Communication accounting").
#include <array>
#include <set>
#include <vector>

#include "train/trainer.h"

namespace mt::train {

namespace {

// The report groups, in the order the metrics list them.
constexpr std::array<const char*, 6> kCommGroups = {"tp", "cp", "ep", "dp", "pp", "world"};

CommTraffic traffic_minus(const CommTraffic& a, const CommTraffic& b) {
    return {.bytes = a.bytes - b.bytes, .calls = a.calls - b.calls, .seconds = a.seconds - b.seconds};
}

}  // namespace

std::array<std::vector<const parallel::Comm*>, 6> Trainer::comm_members() const {
    using parallel::MeshGroup;
    auto group = [&](MeshGroup g) -> const parallel::Comm* { return &mesh_->group(g); };
    // dp is every group the gradient reduction, the ZeRO-1 gathers and the data-parallel scalars go over: the
    // reduction groups dp_span, edp and stage (whose buckets are the tp-partial gradients; the stage spans tp too)
    // and the mesh's dp. A shared NCCL communicator (edp or stage is dp_span's at ep = 1 or tp = 1) counts once.
    const std::array<std::vector<const parallel::Comm*>, 6> members = {{
        {group(MeshGroup::tp), nccl_tp_.get()},
        {group(MeshGroup::cp)},
        // The MoE rows go over tp_ep (the ep group, tp folded in).
        {group(MeshGroup::ep), group(MeshGroup::tp_ep), nccl_ep_.get()},
        {group(MeshGroup::dp),
         group(MeshGroup::dp_span),
         group(MeshGroup::edp),
         group(MeshGroup::stage),
         nccl_dp_span_.get(),
         nccl_edp_.get(),
         nccl_stage_.get()},
        // The activations between the stages, and the tied embedding's gradient between the first and the last.
        {group(MeshGroup::pp), nccl_pp_.get(), tied_embedding_.get()},
        {&mesh_->world()},
    }};
    return members;
}

double Trainer::comm_seconds_total() const {
    std::set<const parallel::Comm*> seen;
    double seconds = 0.0;
    for (const auto& group : comm_members())
        for (const parallel::Comm* comm : group)
            if (comm != nullptr && comm->size() > 1 && seen.insert(comm).second) seconds += comm->seconds();
    return seconds;
}

std::map<std::string, CommTraffic> Trainer::comm_traffic() const {
    const auto members = comm_members();
    std::map<std::string, CommTraffic> out;
    for (size_t g = 0; g < kCommGroups.size(); ++g) {
        CommTraffic& t = out[kCommGroups[g]];
        std::set<const parallel::Comm*> seen;
        for (const parallel::Comm* comm : members[g]) {
            // A communicator of one rank moves nothing (its "collectives" are local copies; the self backend counts
            // them all the same), so a one-process run reports zeros.
            if (comm == nullptr || comm->size() == 1 || !seen.insert(comm).second) continue;
            for (int op = 0; op < parallel::kCommOpCount; ++op) {
                const auto kind = static_cast<parallel::CommOp>(op);
                const parallel::CommOpStats& s = comm->stats(kind);
                t.calls += s.calls;
                // Bytes sent: a receive's bytes are the peer's send.
                if (kind != parallel::CommOp::recv) t.bytes += s.bytes;
            }
            t.seconds += comm->seconds();
        }
    }
    return out;
}

void Trainer::comm_step_begin() {
    comm_step_start_ = comm_traffic();
    comm_seconds_at_step_start_ = comm_seconds_total();
}

void Trainer::add_comm_metrics(nlohmann::json& fields) const {
    const std::map<std::string, CommTraffic> now = comm_traffic();
    for (const char* name : kCommGroups) {
        const auto start = comm_step_start_.find(name);
        const CommTraffic step =
            start != comm_step_start_.end() ? traffic_minus(now.at(name), start->second) : now.at(name);
        const std::string key = std::string("comm/") + name;
        fields[key + "/bytes"] = step.bytes;
        fields[key + "/calls"] = step.calls;
        fields[key + "/seconds"] = step.seconds;
    }
}

}  // namespace mt::train
