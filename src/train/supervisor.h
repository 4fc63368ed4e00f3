// `moetrain supervise` (operations.md §2): runs a training launch command in its own process group, watches the
// ranks' heartbeat files (train/heartbeat.h), and on a failure restarts it from the newest complete checkpoint with
// backoff, writing a `restart` event (and, once the restarted job completes a step, a `recovered` one) into the
// run's metrics.jsonl. Decision by exit code: 0 ends; 2, 3, 4 (config, data, checkpoint: the same input fails again)
// and 127 (no such command) are not retried; 7 (a health stop) ends unless restart_on_health_stop; anything else,
// a death by a signal, or a hang (no rank's step advancing for hang_timeout_s, three times that in a checkpoint or
// evaluation phase) is restarted, at most max_restarts times within restart_window_s. A SIGTERM or SIGINT to the
// supervisor goes to the whole job (which stops at a step boundary with a checkpoint) and ends supervision with the
// job's exit code. With elastic options a restart probes the hosts, drops the ones that fail, and runs on the largest
// world the rest hold that keeps the global batch; a host that comes back is taken in again at a checkpoint.
#pragma once

#include <string>
#include <vector>

#include "train/elastic.h"

namespace mt::train {

struct SuperviseOptions {
    std::vector<std::string> command;  // the launch: moetrain train ... or mpirun ... moetrain train ...
    std::string run_dir;               // the job's run.dir: heartbeats, checkpoints, metrics.jsonl
    int max_restarts = 10;
    double restart_window_s = 3600.0;
    double hang_timeout_s = 300.0;  // health.hang_timeout_s
    double kill_grace_s = 30.0;     // SIGTERM, then SIGKILL after this
    double backoff_s = 1.0;         // the first restart's wait, doubled each time up to backoff_max_s
    double backoff_max_s = 60.0;
    double poll_s = 0.2;
    bool restart_on_health_stop = false;  // health.on_stop = "restart"
    // Elastic resume (elastic.h, docs/operations.md "Elastic resume"), on when min_ranks > 0: the hosts and their
    // slots (rank r runs on the host whose slots hold it, in order), probe failures in a row that drop a host, the
    // seconds of good probes that bring one back (the job then stops at a checkpoint and restarts on the larger
    // world), the probe command ("{host}" replaced), and the launch's layout.
    int64_t min_ranks = 0, max_ranks = 0;
    std::vector<ElasticHost> hosts;
    int host_failures = 1;
    double grow_after_s = 60.0;
    double probe_every_s = 1.0;
    std::string probe;
    ElasticLayout layout;
};

// The launch of attempt `attempt` (0: the first): a `moetrain train` command continues from the newest checkpoint
// (`--resume` added; a `--resume-from DIR` of the first launch becomes `--resume` on restarts); any other command
// runs as given.
std::vector<std::string> supervise_launch(const std::vector<std::string>& command, int attempt);

// Whether an exit code is retried (the decision table above; signals are always retried).
bool supervise_retries(int exit_code, bool restart_on_health_stop);

// Supervises until the job succeeds or is given up; returns the exit code for the supervisor's own exit.
int supervise(const SuperviseOptions& options);

}  // namespace mt::train
