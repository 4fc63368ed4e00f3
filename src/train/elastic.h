// Elastic resume (operations.md §3, docs/operations.md "Elastic resume"): which world a restarted job runs on when
// hosts are lost or come back, and how its launch command changes. The model layout (tp x cp x pp, and ep) stays;
// the ranks that read different data (dp_span = ep x dp) absorb the change, and grad_accum keeps the global batch:
// grad_accum' = grad_accum x D / D' (D = world / (tp cp pp)). A world whose D' does not divide grad_accum x D is
// rounded down to the largest one that does.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mt::train {

// What the first launch ran: its world and the job config's layout and accumulation.
struct ElasticLayout {
    int64_t world = 1;       // the launch's rank count (mpirun -np)
    int64_t model_size = 1;  // tp x cp x pp: the ranks one data replica spans
    int64_t ep = 1;          // the data ranks come in groups of ep
    int64_t grad_accum = 1;  // train.grad_accum at that world
};

// A world to launch: its ranks, the ranks that read different data, and the grad_accum that keeps the batch.
struct ElasticWorld {
    int64_t ranks = 0, data_ranks = 0, grad_accum = 0;
    bool rounded = false;  // fewer ranks than available: the batch did not divide
};

// The largest world of at most `available` ranks (and at most max_ranks when > 0) that keeps the global batch:
// a multiple of model_size whose data ranks are a multiple of ep and divide grad_accum x D. nullopt below
// min_ranks.
std::optional<ElasticWorld> elastic_world(const ElasticLayout& layout,
                                          int64_t available,
                                          int64_t min_ranks,
                                          int64_t max_ranks);

// The launch command for a world: the launcher's rank count (-np / -n / --np / -c of mpirun, -n / --ntasks of srun)
// set to world.ranks, a --host / -H list replaced by the hosts given (name:slots), and `--set train.grad_accum=G
// --set parallel.dp=0` added at the end (the launched program is `moetrain train`, last on the line). Fails (exit 2)
// when the command names no rank count.
std::vector<std::string> elastic_launch(const std::vector<std::string>& command,
                                        const ElasticWorld& world,
                                        const std::string& host_list);

// The rank count a launch command gives its launcher (0 when it names none).
int64_t launch_rank_count(const std::vector<std::string>& command);

// A host the job may run on, with its slots, and its health as the probe sees it.
struct ElasticHost {
    std::string name;
    int64_t slots = 1;
    bool up = true;
    int failures = 0;  // probe failures in a row
    std::optional<std::chrono::steady_clock::time_point> healthy_since =
        std::nullopt;  // a down host's first good probe since
};

// "a:2,b:2" -> hosts; exit 2 naming --hosts on a malformed entry.
std::vector<ElasticHost> elastic_parse_hosts(const std::string& text);

// Runs the probe command for a host ("{host}" replaced by its name) through /bin/sh, at most timeout_s seconds;
// true when it exits 0.
bool elastic_probe(const std::string& probe, const std::string& host, double timeout_s);

}  // namespace mt::train
