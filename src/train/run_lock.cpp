// run.dir checks and the flock on run.dir/.lock.
#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/file_util.h"

namespace mt::train {

namespace fs = std::filesystem;
using core::ExitCode;

namespace {

// The holder a lock file names ("PID 123 on host h"), or "" when it names none.
std::string lock_holder(int fd) {
    char buf[512] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0) return "";
    std::string pid, host;
    const std::string text(buf, static_cast<size_t>(n));
    size_t pos = 0;
    while (pos < text.size()) {
        const size_t end = std::min(text.find('\n', pos), text.size());
        const std::string line = text.substr(pos, end - pos);
        if (line.rfind("pid=", 0) == 0) pid = line.substr(4);
        if (line.rfind("host=", 0) == 0) host = line.substr(5);
        pos = end + 1;
    }
    if (pid.empty()) return "";
    return fmt::format("PID {} on host {}", pid, host.empty() ? "?" : host);
}

}  // namespace

void run_dir_prepare(const std::string& dir, const std::string& source) {
    if (dir.empty())
        core::fail_hint(
            ExitCode::usage, "set run.dir to a directory for checkpoints and metrics", "run.dir is empty [{}]", source);
    std::error_code ec;
    const fs::file_status st = fs::status(dir, ec);
    if (fs::exists(st) && !fs::is_directory(st))
        core::fail_hint(ExitCode::usage,
                        "set run.dir to a directory (or a path that does not exist yet)",
                        "run.dir = \"{}\" exists but is not a directory [{}]",
                        dir,
                        source);
    ec.clear();
    if (!fs::exists(st)) fs::create_directories(dir, ec);
    if (ec)
        core::fail_hint(ExitCode::usage,
                        "set run.dir to a path you may create and write",
                        "run.dir = \"{}\" cannot be created: {} [{}]",
                        dir,
                        ec.message(),
                        source);
    if (::access(dir.c_str(), W_OK | X_OK) != 0)
        core::fail_hint(ExitCode::usage,
                        "set run.dir to a path you may create and write",
                        "run.dir = \"{}\" is not writable: {} [{}]",
                        dir,
                        std::strerror(errno),
                        source);
}

RunLock::RunLock(const std::string& dir, const std::string& source) {
    run_dir_prepare(dir, source);
    const std::string path = (fs::path(dir) / ".lock").string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        core::fail(
            ExitCode::usage, "run.dir = \"{}\": cannot create the lock file: {} [{}]", dir, std::strerror(errno), path);
    int rc;
    do {
        rc = ::flock(fd, LOCK_EX | LOCK_NB);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno == EWOULDBLOCK) {
        const std::string holder = lock_holder(fd);
        ::close(fd);
        core::fail_hint(ExitCode::usage,
                        "wait for that run to end or stop it, or give this one another run.dir; two trainings in one "
                        "directory delete each other's checkpoints and mix their metrics",
                        "run.dir = \"{}\" is in use by another training: {} holds its lock [{}]",
                        dir,
                        holder.empty() ? "a process that has not written its PID yet" : holder,
                        path);
    }
    if (rc != 0) {
        // Some parallel file systems mount without flock (ENOSYS, ENOLCK, EOPNOTSUPP): train, but say so.
        fmt::print(
            "moetrain: warning: cannot lock run.dir ({}); a second training in this directory would not be "
            "detected [{}]\n",
            std::strerror(errno),
            path);
        ::close(fd);
        return;
    }
    fd_ = fd;
    if (const std::string old = lock_holder(fd); !old.empty())
        fmt::print("moetrain: taking over the lock of {}, which ended without releasing it [{}]\n", old, path);
    const std::string text = fmt::format("pid={}\nhost={}\n", ::getpid(), core::host_name("?"));
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
        fmt::print(
            "moetrain: warning: cannot record this process in the lock file: {} [{}]\n", std::strerror(errno), path);
}

RunLock& RunLock::operator=(RunLock&& other) noexcept {
    if (this != &other) {
        this->~RunLock();
        fd_ = other.fd_;
        other.fd_ = -1;
    }
    return *this;
}

RunLock::~RunLock() {
    if (fd_ < 0) return;
    // Emptied, not removed: unlinking a locked file lets a process that opened the old inode and one that creates a
    // new file both hold "the" lock.
    (void)!::ftruncate(fd_, 0);
    ::close(fd_);
    fd_ = -1;
}

}  // namespace mt::train
