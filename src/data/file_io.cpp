// MappedFile (mmap, read-only) and AtomicFile (tmp + fsync + rename) for token data and stats files.
#include "data/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace mt::data {

using core::ExitCode;

MappedFile::MappedFile(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            core::fail_hint(ExitCode::data, "check data.paths and the working directory.", "file not found [{}]", path);
        core::fail(ExitCode::data, "cannot open: {} [{}]", std::strerror(errno), path);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        core::fail(ExitCode::data, "cannot stat: {} [{}]", std::strerror(err), path);
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        core::fail(ExitCode::data, "not a regular file [{}]", path);
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            core::fail(ExitCode::data, "cannot mmap: {} [{}]", std::strerror(err), path);
        }
        data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_path_(fmt::format("{}.tmp", path_)) {
    fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) core::fail(ExitCode::data, "cannot create: {} [{}]", std::strerror(errno), tmp_path_);
}

AtomicFile::~AtomicFile() {
    if (fd_ >= 0) {
        ::close(fd_);
        ::unlink(tmp_path_.c_str());
    }
}

void AtomicFile::write(const void* data, size_t bytes) {
    MT_CHECK(fd_ >= 0, "write after commit [{}]", path_);
    const auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
        const ssize_t n = ::write(fd_, p, bytes);
        if (n < 0) {
            if (errno == EINTR) continue;
            core::fail(ExitCode::data, "write failed: {} [{}]", std::strerror(errno), tmp_path_);
        }
        p += n;
        bytes -= static_cast<size_t>(n);
    }
}

void AtomicFile::commit() {
    MT_CHECK(fd_ >= 0, "commit twice [{}]", path_);
    if (::fsync(fd_) != 0) core::fail(ExitCode::data, "fsync failed: {} [{}]", std::strerror(errno), tmp_path_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
        ::unlink(tmp_path_.c_str());
        core::fail(ExitCode::data, "close failed: {} [{}]", std::strerror(errno), tmp_path_);
    }
    if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp_path_.c_str());
        core::fail(ExitCode::data, "cannot rename {} to {}: {}", tmp_path_, path_, std::strerror(err));
    }
    const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
    const int dfd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

void file_write_atomic(const std::string& path, std::string_view contents) {
    AtomicFile f(path);
    f.write(contents);
    f.commit();
}

}  // namespace mt::data
