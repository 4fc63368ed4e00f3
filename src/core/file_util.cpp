// POSIX implementation of the atomic writer, reads, directory fsync and memory maps.
#include "core/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/crc32c.h"

namespace mt::core {

namespace {

std::string errno_str(int err) {
    return std::strerror(err);
}

std::string parent_dir(const std::string& path) {
    const std::string parent = std::filesystem::path(path).parent_path().string();
    return parent.empty() ? "." : parent;
}

// Opens a file for reading; fails naming it.
int open_read(const std::string& path, ExitCode code) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        fail_hint(code, "check the path and the working directory", "file not found [{}]", path);
    if (fd < 0) fail(code, "cannot open the file: {} [{}]", errno_str(errno), path);
    return fd;
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path, ExitCode code)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), code_(code) {
    fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(code_, "cannot create {}: {} [{}]", tmp_path_, errno_str(errno), path_);
}

AtomicFileWriter::~AtomicFileWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFileWriter::fail_io(const char* what) {
    const int err = errno;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_path_.c_str());
    fail(code_, "cannot {} {}: {} [{}]", what, tmp_path_, errno_str(err), path_);
}

void AtomicFileWriter::write(const void* data, size_t n) {
    MT_CHECK(fd_ >= 0 && !committed_, "write to a closed AtomicFileWriter for {}", path_);
    const auto* p = static_cast<const char*>(data);
    crc_ = core::crc32c(p, n, crc_);
    bytes_ += n;
    while (n > 0) {
        const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
        if (w < 0) {
            if (errno == EINTR) continue;
            fail_io("write");
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
}

void AtomicFileWriter::commit() {
    MT_CHECK(fd_ >= 0 && !committed_, "commit of a closed AtomicFileWriter for {}", path_);
    if (::fsync(fd_) != 0) fail_io("fsync");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(tmp_path_.c_str());
        fail(code_, "cannot close {}: {} [{}]", tmp_path_, errno_str(err), path_);
    }
    if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp_path_.c_str());
        fail(code_, "cannot rename {} to its final name: {} [{}]", tmp_path_, errno_str(err), path_);
    }
    committed_ = true;
    fsync_dir(parent_dir(path_), code_);
}

void write_file_atomic(const std::string& path, const void* data, size_t n, ExitCode code) {
    AtomicFileWriter writer(path, code);
    writer.write(data, n);
    writer.commit();
}

void write_file_atomic(const std::string& path, std::string_view bytes, ExitCode code) {
    write_file_atomic(path, bytes.data(), bytes.size(), code);
}

namespace {
// Reads a whole file in chunks of `chunk` bytes, calling fn(data, n) for each; fails naming the file.
template <typename Fn>
void read_chunks(const std::string& path, ExitCode code, size_t chunk, Fn&& fn) {
    const int fd = open_read(path, code);
    std::vector<char> buf(chunk);
    for (;;) {
        const ssize_t r = ::read(fd, buf.data(), buf.size());
        if (r < 0) {
            if (errno == EINTR) continue;
            const int err = errno;
            ::close(fd);
            fail(code, "cannot read the file: {} [{}]", errno_str(err), path);
        }
        if (r == 0) break;
        fn(buf.data(), static_cast<size_t>(r));
    }
    ::close(fd);
}
}  // namespace

std::string read_file(const std::string& path, ExitCode code) {
    std::string out;
    read_chunks(path, code, size_t{1} << 20, [&](const char* data, size_t n) { out.append(data, n); });
    return out;
}

void fsync_dir(const std::string& dir, ExitCode code) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) fail(code, "cannot open the directory: {} [{}]", errno_str(errno), dir);
    // Some file systems cannot fsync a directory (EINVAL); the rename is then as durable as they allow.
    if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
        const int err = errno;
        ::close(fd);
        fail(code, "cannot fsync the directory: {} [{}]", errno_str(err), dir);
    }
    ::close(fd);
}

uint64_t file_size(const std::string& path, ExitCode code) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) fail(code, "cannot stat the file: {} [{}]", errno_str(errno), path);
    if (!S_ISREG(st.st_mode)) fail(code, "not a regular file [{}]", path);
    return static_cast<uint64_t>(st.st_size);
}

uint32_t file_crc32c(const std::string& path, ExitCode code) {
    uint32_t crc = 0;
    read_chunks(path, code, size_t{4} << 20, [&](const char* data, size_t n) { crc = crc32c(data, n, crc); });
    return crc;
}

MappedFile::MappedFile(std::string path, ExitCode code) : path_(std::move(path)) {
    const int fd = open_read(path_, code);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(code, "not a readable regular file [{}]", path_);
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            fail(code, "cannot map the file: {} [{}]", errno_str(err), path_);
        }
        data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace mt::core
