// Elastic resume: the world a restart runs on and its launch command (elastic.h).
#include "train/elastic.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "core/clock.h"
#include "core/error.h"

namespace mt::train {

namespace {

bool is_rank_option(const std::string& launcher, const std::string& a) {
    if (launcher == "srun") return a == "-n" || a == "--ntasks";
    return a == "-np" || a == "-n" || a == "--np" || a == "-c";
}

// The index of the launcher's name in the command (mpirun, mpiexec, srun; with a path), or -1.
std::ptrdiff_t launcher_index(const std::vector<std::string>& command, std::string* name) {
    for (size_t i = 0; i < command.size(); ++i) {
        const std::string base = command[i].substr(command[i].find_last_of('/') + 1);
        if (base == "mpirun" || base == "mpiexec" || base == "srun" || base == "orterun") {
            *name = base == "srun" ? "srun" : "mpirun";
            return static_cast<std::ptrdiff_t>(i);
        }
        if (base == "moetrain") break;  // a launcher's options come before the program
    }
    return -1;
}

}  // namespace

std::optional<ElasticWorld> elastic_world(const ElasticLayout& layout,
                                          int64_t available,
                                          int64_t min_ranks,
                                          int64_t max_ranks) {
    MT_CHECK(layout.model_size >= 1 && layout.ep >= 1 && layout.world % layout.model_size == 0,
             "elastic_world: the launch world {} is not a multiple of the model layout {}",
             layout.world,
             layout.model_size);
    const int64_t d0 = layout.world / layout.model_size, micro = layout.grad_accum * d0;  // micro-batches per step
    int64_t cap = available;
    if (max_ranks > 0) cap = std::min(cap, max_ranks);
    const int64_t first = cap / layout.model_size;  // data ranks if every slot were used
    for (int64_t d = first; d >= 1; --d) {
        const int64_t ranks = d * layout.model_size;
        if (ranks < min_ranks) break;
        if (d % layout.ep != 0 || micro % d != 0) continue;
        return ElasticWorld{.ranks = ranks, .data_ranks = d, .grad_accum = micro / d, .rounded = d != first};
    }
    return std::nullopt;
}

int64_t launch_rank_count(const std::vector<std::string>& command) {
    std::string launcher;
    const std::ptrdiff_t at = launcher_index(command, &launcher);
    if (at < 0) return 0;
    for (size_t i = static_cast<size_t>(at) + 1; i + 1 < command.size(); ++i) {
        if (command[i] == "moetrain" || command[i].ends_with("/moetrain")) break;
        if (is_rank_option(launcher, command[i])) return std::strtoll(command[i + 1].c_str(), nullptr, 10);
        if (command[i].rfind("--ntasks=", 0) == 0) return std::strtoll(command[i].c_str() + 9, nullptr, 10);
    }
    return 0;
}

std::vector<std::string> elastic_launch(const std::vector<std::string>& command,
                                        const ElasticWorld& world,
                                        const std::string& host_list) {
    std::string launcher;
    const std::ptrdiff_t at = launcher_index(command, &launcher);
    if (at < 0 || launch_rank_count(command) <= 0)
        core::fail_hint(core::ExitCode::usage,
                        "launch the job with `mpirun -np N ...` or `srun -n N ...`",
                        "supervise --min-ranks: the launch command names no rank count to change");
    std::vector<std::string> out;
    bool in_launcher = true;
    for (size_t i = 0; i < command.size(); ++i) {
        const std::string& a = command[i];
        if (static_cast<std::ptrdiff_t>(i) > at && in_launcher && (a == "moetrain" || a.ends_with("/moetrain")))
            in_launcher = false;
        if (in_launcher && static_cast<std::ptrdiff_t>(i) > at && i + 1 < command.size()) {
            if (is_rank_option(launcher, a)) {
                out.insert(out.end(), {a, std::to_string(world.ranks)});
                ++i;
                continue;
            }
            if ((a == "--host" || a == "-H") && !host_list.empty()) {
                out.insert(out.end(), {a, host_list});
                ++i;
                continue;
            }
        }
        out.push_back(a);
    }
    // Last, so that they win over the job's own --set items.
    out.insert(out.end(), {"--set", fmt::format("train.grad_accum={}", world.grad_accum), "--set", "parallel.dp=0"});
    return out;
}

std::vector<ElasticHost> elastic_parse_hosts(const std::string& text) {
    std::vector<ElasticHost> hosts;
    size_t start = 0;
    while (start <= text.size()) {
        const size_t comma = text.find(',', start);
        const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        const size_t colon = item.find(':');
        char* end = nullptr;
        const long long slots = colon == std::string::npos ? 1 : std::strtoll(item.c_str() + colon + 1, &end, 10);
        if (item.empty() || colon == 0 || slots < 1 || (end != nullptr && *end != '\0'))
            core::fail(core::ExitCode::usage, "supervise --hosts: \"{}\" is not NAME or NAME:SLOTS", item);
        ElasticHost host;
        host.name = item.substr(0, colon);
        host.slots = slots;
        hosts.push_back(std::move(host));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return hosts;
}

bool elastic_probe(const std::string& probe, const std::string& host, double timeout_s) {
    std::string cmd = probe;
    for (size_t at = cmd.find("{host}"); at != std::string::npos; at = cmd.find("{host}", at + host.size()))
        cmd.replace(at, 6, host);
    const pid_t pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
        const int null = ::open("/dev/null", O_RDWR);  // a probe's output is not the supervisor's
        if (null >= 0) ::dup2(null, STDOUT_FILENO), ::dup2(null, STDERR_FILENO);
        ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
    }
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
        int status = 0;
        if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (core::seconds_since(start) > timeout_s) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

}  // namespace mt::train
