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

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

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
    } while (seconds_since(start) < seconds);
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
    for (int attempt = 0;; ++attempt) {
        const std::vector<std::string> args = supervise_launch(o.command, attempt);
        Attempt job = launch(args);
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
            for (const auto& [rank, beat] : read_heartbeats(o.run_dir)) {
                const auto& [step, phase] = beat;
                auto it = progress.find(rank);
                if (it == progress.end() || it->second.first != step) progress[rank] = {step, Clock::now()};
                last_step = std::max(last_step, step);
                if (phase == "checkpoint" || phase == "eval") timeout = 3 * o.hang_timeout_s;
                if (attempt > 0 && !recovered_after && step > resumed) recovered_after = seconds_since(failed_at);
            }
            bool hung = progress.empty() && seconds_since(job.started) > timeout;
            for (const auto& [rank, p] : progress) hung = hung || seconds_since(p.second) > timeout;
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
            last_step = std::max(last_step, beat.first);
            if (behind < 0 || beat.first < behind) behind = beat.first, phase = beat.second;
        }
        MetricsLog log(o.run_dir + "/metrics.jsonl");
        if (recovered_after)
            log.write(resumed,
                      "event",
                      {{"event", "recovered"}, {"resumed_step", resumed}, {"time_to_recover_s", *recovered_after}});
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
        // The job is down: no newer checkpoint comes before the relaunch reads this one.
        resumed = resumable_step(o.run_dir);
        const int64_t from = std::max<int64_t>(resumed, 0);
        log.write(last_step,
                  "event",
                  {{"event", "restart"},
                   {"reason", reason},
                   {"exit_code", code},
                   {"signal", WIFSIGNALED(status) ? WTERMSIG(status) : 0},
                   {"last_step", last_step},
                   {"resumed_step", from},
                   {"steps_lost", std::max<int64_t>(last_step - from, 0)},
                   {"phase", phase},
                   {"downtime_s", seconds_since(failed)},
                   {"attempt", attempt + 1}});
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
