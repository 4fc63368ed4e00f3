// The supervisor's loop: launch, watch (exit status and heartbeats), decide, back off, relaunch. Single host: a
// rank's death reaches it as the launcher's exit (mpirun ends the job when a rank dies).
#include "train/supervisor.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "core/clock.h"
#include "core/error.h"
#include "train/checkpoint_io.h"
#include "train/metrics.h"

namespace mt::train {

namespace fs = std::filesystem;

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int sig) {
    g_stop_signal = sig;
}

using Clock = std::chrono::steady_clock;

// The newest complete checkpoint's step under run_dir (-1: none).
int64_t resumable_step(const std::string& run_dir) {
    const auto latest = checkpoint_find_latest(run_dir + "/checkpoints");
    if (!latest) return -1;
    const std::string name = fs::path(*latest).filename().string();  // step_00000010
    return name.rfind("step_", 0) == 0 ? std::stoll(name.substr(5)) : -1;
}

// Each rank's last heartbeat: (step, phase), for the files that parse (one being renamed is skipped this round).
std::map<int, std::pair<int64_t, std::string>> read_heartbeats(const std::string& run_dir) {
    std::map<int, std::pair<int64_t, std::string>> beats;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(run_dir + "/heartbeat", ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("rank_", 0) != 0 || entry.path().extension() != ".json") continue;
        std::ifstream in(entry.path());
        const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
        if (j.is_discarded() || !j.contains("rank") || !j.contains("step")) continue;
        beats[j.at("rank").get<int>()] = {j.at("step").get<int64_t>(), j.value("phase", "")};
    }
    return beats;
}

// The pid a rank's heartbeat names (-1 when there is none).
pid_t heartbeat_pid(const std::string& run_dir, int rank) {
    std::ifstream in(fmt::format("{}/heartbeat/rank_{}.json", run_dir, rank));
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    return j.is_object() && j.contains("pid") ? j.at("pid").get<pid_t>() : -1;
}

struct Attempt {
    pid_t pid = -1;
    Clock::time_point started;
};

Attempt launch(const std::vector<std::string>& args) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) core::fail(core::ExitCode::internal, "supervise: fork failed: {}", std::strerror(errno));
    if (pid == 0) {
        ::setpgid(0, 0);  // its own process group: a stop or a kill reaches every process of the job
        ::signal(SIGTERM, SIG_DFL), ::signal(SIGINT, SIG_DFL);
        ::execvp(argv[0], argv.data());
        std::fprintf(stderr, "moetrain supervise: cannot run %s: %s\n", argv[0], std::strerror(errno));
        ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so that no signal can come before the child's own call
    return {pid, Clock::now()};
}

// Waits up to `seconds` for the job to exit; its wait status, or nullopt.
std::optional<int> wait_for_exit(pid_t pid, double seconds) {
    const auto start = Clock::now();
    do {
        int status = 0;
        const pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) return status;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (core::seconds_since(start) < seconds);
    return std::nullopt;
}

// SIGTERM to the job's process group, SIGKILL after the grace period; the wait status.
int stop_job(pid_t pid, double grace_s) {
    ::kill(-pid, SIGTERM);
    if (auto status = wait_for_exit(pid, grace_s)) return *status;
    ::kill(-pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
}

int exit_code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

// Elastic resume: the hosts' state, the world they hold and the launch for it.
struct ElasticState {
    const SuperviseOptions& o;
    std::vector<ElasticHost> hosts;
    ElasticWorld world;
    Clock::time_point last_probe;

    bool on() const {
        return o.min_ranks > 0;
    }
    int64_t slots_up() const {
        int64_t n = 0;
        for (const auto& h : hosts) n += h.up ? h.slots : 0;
        return n;
    }
    std::string host_list() const {
        std::string out;
        for (const auto& h : hosts)
            if (h.up) out += fmt::format("{}{}:{}", out.empty() ? "" : ",", h.name, h.slots);
        return out;
    }
    // After a failure: every host probed; one failing host_failures times in a row is dropped, a passing one kept.
    void probe_all() {
        for (auto& h : hosts) {
            if (elastic_probe(o.probe, h.name, 30.0)) {
                h.failures = 0;
                continue;
            }
            if (++h.failures >= o.host_failures) h.up = false, h.healthy_since.reset();
        }
    }
    // While the job runs on fewer hosts: the down hosts probed every probe_every_s; true when one has passed every
    // probe for grow_after_s and a larger world would run.
    bool ready_to_grow() {
        if (core::seconds_since(last_probe) < o.probe_every_s) return false;
        last_probe = Clock::now();
        int64_t back = 0;
        for (auto& h : hosts) {
            if (h.up) continue;
            if (!elastic_probe(o.probe, h.name, 30.0)) {
                h.healthy_since.reset();
                continue;
            }
            if (!h.healthy_since) h.healthy_since = Clock::now();
            if (core::seconds_since(*h.healthy_since) >= o.grow_after_s) back += h.slots;
        }
        if (back == 0) return false;
        const auto bigger = elastic_world(o.layout, slots_up() + back, o.min_ranks, o.max_ranks);
        return bigger && bigger->ranks > world.ranks;
    }
    void take_back_healthy() {
        for (auto& h : hosts)
            if (!h.up && h.healthy_since && core::seconds_since(*h.healthy_since) >= o.grow_after_s)
                h.up = true, h.failures = 0, h.healthy_since.reset();
    }
    std::optional<ElasticWorld> fit() const {
        return elastic_world(o.layout, slots_up(), o.min_ranks, o.max_ranks);
    }
};

}  // namespace

std::vector<std::string> supervise_launch(const std::vector<std::string>& command, int attempt) {
    const bool train = std::find(command.begin(), command.end(), "train") != command.end();
    if (!train) return command;
    std::vector<std::string> out;
    bool resume = false;
    for (size_t i = 0; i < command.size(); ++i) {
        if (command[i] == "--resume-from" && attempt > 0) {
            ++i;  // a restart continues from the newest checkpoint, which is at least that one
            continue;
        }
        resume = resume || command[i] == "--resume" || command[i] == "--resume-from";
        out.push_back(command[i]);
    }
    if (!resume) out.emplace_back("--resume");
    return out;
}

bool supervise_retries(int exit_code, bool restart_on_health_stop) {
    switch (exit_code) {
        case 0:
        case static_cast<int>(core::ExitCode::usage):
        case static_cast<int>(core::ExitCode::data):
        case static_cast<int>(core::ExitCode::checkpoint):
        case 127:
            return false;
        case static_cast<int>(core::ExitCode::health):
            return restart_on_health_stop;
        default:
            return true;
    }
}

int supervise(const SuperviseOptions& o) {
    MT_CHECK(!o.command.empty(), "supervise: no launch command (give it after --)");
    MT_CHECK(!o.run_dir.empty(), "supervise: --run-dir names the job's run.dir");
    std::error_code ec;
    fs::create_directories(o.run_dir, ec);  // where the events go, whatever the job does
    if (ec)
        core::fail(core::ExitCode::usage, "supervise: cannot create the run directory {}: {}", o.run_dir, ec.message());
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
    std::deque<Clock::time_point> restarts;  // within the window
    double backoff = o.backoff_s;
    Clock::time_point failed_at;  // when the last failure was seen: the recovery time counts from it
    int64_t resumed = -1;         // the checkpoint step a restart continues from (-1: the first launch)
    ElasticState elastic{o, o.hosts, {}, Clock::now()};
    const int64_t full_world = o.layout.world;
    elastic.world = {.ranks = full_world,
                     .data_ranks = full_world / std::max<int64_t>(o.layout.model_size, 1),
                     .grad_accum = o.layout.grad_accum};
    for (int attempt = 0;; ++attempt) {
        std::vector<std::string> args = supervise_launch(o.command, attempt);
        if (elastic.on() && elastic.world.ranks != full_world)
            args = elastic_launch(args, elastic.world, elastic.host_list());
        Attempt job = launch(args);
        bool growing = false;  // stopped (SIGTERM: a checkpoint, exit 8) to restart on more hosts
        // Hang detection: each rank's step and when it last changed (stale files of an earlier attempt count from
        // this launch); before any heartbeat, the time since the launch.
        std::map<int, std::pair<int64_t, Clock::time_point>> progress;
        int64_t last_step = resumed;
        std::optional<double> recovered_after;
        std::string reason;
        int status = 0;
        bool forwarded = false;
        for (;;) {
            if (auto s = wait_for_exit(job.pid, o.poll_s)) {
                status = *s;
                break;
            }
            if (g_stop_signal != 0 && !forwarded) {
                ::kill(-job.pid, g_stop_signal);  // the job checkpoints and stops at the step boundary
                forwarded = true;
            }
            double timeout = o.hang_timeout_s;
            if (elastic.on() && !growing && elastic.world.ranks < full_world && elastic.ready_to_grow()) {
                // SIGTERM to one rank: the ranks agree to stop at the next step boundary and write its checkpoint
                // (a launcher given SIGTERM may kill its ranks before they finish it).
                const pid_t rank0 = heartbeat_pid(o.run_dir, 0);
                if (rank0 <= 0 || ::kill(rank0, SIGTERM) != 0) ::kill(-job.pid, SIGTERM);
                growing = true;
            }
            for (const auto& [rank, beat] : read_heartbeats(o.run_dir)) {
                if (rank >= elastic.world.ranks) continue;  // a rank of a larger world before a shrink
                const auto& [step, phase] = beat;
                auto it = progress.find(rank);
                if (it == progress.end() || it->second.first != step) progress[rank] = {step, Clock::now()};
                last_step = std::max(last_step, step);
                if (phase == "checkpoint" || phase == "eval") timeout = 3 * o.hang_timeout_s;
                if (attempt > 0 && !recovered_after && step > resumed) recovered_after = core::seconds_since(failed_at);
            }
            bool hung = progress.empty() && core::seconds_since(job.started) > timeout;
            for (const auto& [rank, p] : progress) hung = hung || core::seconds_since(p.second) > timeout;
            if (hung && !forwarded) {
                reason = "hang";
                status = stop_job(job.pid, o.kill_grace_s);
                break;
            }
        }
        const int code = exit_code_of(status);
        const Clock::time_point failed = Clock::now();
        // Where the job was: the newest step, and the phase of the rank furthest behind (the one a hang waits on).
        std::string phase;
        int64_t behind = -1;
        for (const auto& [rank, beat] : read_heartbeats(o.run_dir)) {
            if (rank >= elastic.world.ranks) continue;
            last_step = std::max(last_step, beat.first);
            if (behind < 0 || beat.first < behind) behind = beat.first, phase = beat.second;
        }
        MetricsLog log(o.run_dir + "/metrics.jsonl");
        if (recovered_after)
            log.write(resumed,
                      "event",
                      {{"event", "recovered"}, {"resumed_step", resumed}, {"time_to_recover_s", *recovered_after}});
        if (growing && code == static_cast<int>(core::ExitCode::stopped)) {
            // Stopped at a checkpoint to take the hosts back: not a failure, no backoff.
            elastic.take_back_healthy();
            const ElasticWorld before = elastic.world;
            if (const auto bigger = elastic.fit()) elastic.world = *bigger;
            resumed = resumable_step(o.run_dir);
            log.write(last_step,
                      "event",
                      {{"event", "grow"},
                       {"from_ranks", before.ranks},
                       {"ranks", elastic.world.ranks},
                       {"grad_accum", elastic.world.grad_accum},
                       {"hosts", elastic.host_list()},
                       {"resumed_step", std::max<int64_t>(resumed, 0)}});
            std::fprintf(
                stderr,
                "moetrain supervise: hosts are back; restarting on %lld ranks (grad_accum %lld) from step %lld\n",
                static_cast<long long>(elastic.world.ranks),
                static_cast<long long>(elastic.world.grad_accum),
                static_cast<long long>(resumed));
            failed_at = Clock::now();
            continue;
        }
        if (forwarded || (reason.empty() && !supervise_retries(code, o.restart_on_health_stop))) {
            if (code != 0)
                std::fprintf(stderr, "moetrain supervise: the job ended with exit %d; not restarted\n", code);
            return code;
        }
        if (reason.empty()) reason = WIFSIGNALED(status) ? "signal" : "exit";
        while (!restarts.empty() &&
               std::chrono::duration<double>(failed - restarts.front()).count() > o.restart_window_s)
            restarts.pop_front();
        if (static_cast<int>(restarts.size()) >= o.max_restarts) {
            std::fprintf(
                stderr,
                "moetrain supervise: the job failed (%s, exit %d) after %d restarts within %.0f s; giving up\n",
                reason.c_str(),
                code,
                o.max_restarts,
                o.restart_window_s);
            log.write(last_step, "event", {{"event", "gave_up"}, {"reason", reason}, {"exit_code", code}});
            return code == 0 ? 1 : code;
        }
        std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
        // Elastic: the hosts that fail their probe are dropped; the job runs on the largest world the rest hold.
        nlohmann::json world_fields = nlohmann::json::object();
        if (elastic.on()) {
            elastic.probe_all();
            const auto fit = elastic.fit();
            if (!fit) {
                std::fprintf(stderr,
                             "moetrain supervise: the hosts left (%s) hold %lld ranks, fewer than --min-ranks %lld "
                             "with the global batch kept; giving up\n",
                             elastic.host_list().c_str(),
                             static_cast<long long>(elastic.slots_up()),
                             static_cast<long long>(o.min_ranks));
                log.write(last_step, "event", {{"event", "gave_up"}, {"reason", "hosts"}, {"exit_code", code}});
                return code == 0 ? 1 : code;
            }
            elastic.world = *fit;
            world_fields = {{"ranks", fit->ranks},
                            {"grad_accum", fit->grad_accum},
                            {"hosts", elastic.host_list()},
                            {"rounded", fit->rounded}};
        }
        // The job is down: no newer checkpoint comes before the relaunch reads this one.
        resumed = resumable_step(o.run_dir);
        const int64_t from = std::max<int64_t>(resumed, 0);
        nlohmann::json event = {{"event", "restart"},
                                {"reason", reason},
                                {"exit_code", code},
                                {"signal", WIFSIGNALED(status) ? WTERMSIG(status) : 0},
                                {"last_step", last_step},
                                {"resumed_step", from},
                                {"steps_lost", std::max<int64_t>(last_step - from, 0)},
                                {"phase", phase},
                                {"downtime_s", core::seconds_since(failed)},
                                {"attempt", attempt + 1}};
        if (elastic.on()) event["world"] = world_fields;
        log.write(last_step, "event", event);
        std::fprintf(stderr,
                     "moetrain supervise: the job failed (%s, exit %d) at step %lld; restart %d from step %lld\n",
                     reason.c_str(),
                     code,
                     static_cast<long long>(last_step),
                     static_cast<int>(restarts.size()) + 1,
                     static_cast<long long>(from));
        restarts.push_back(failed);
        failed_at = failed;
        backoff = std::min(backoff * 2, o.backoff_max_s);
    }
}

}  // namespace mt::train
