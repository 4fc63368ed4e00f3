// POSIX implementation of the atomic writer, reads, directory fsync and memory maps.
#include "core/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/crc32c.h"
#include "core/signals.h"

namespace mt::core {

namespace {

std::string errno_str(int err) {
    return std::strerror(err);
}

std::string parent_dir(const std::string& path) {
    const std::string parent = std::filesystem::path(path).parent_path().string();
    return parent.empty() ? "." : parent;
}

const char* file_type_name(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    return "a special file";
}

// Opens a regular file for reading; fails naming it. O_NONBLOCK makes the open of a FIFO return at once instead of
// waiting for a writer, so the type check below sees it; regular files ignore the flag. stat_out, when given, gets
// the open file's stat (its size for a reader that splits it).
int open_read(const std::string& path, ExitCode code, struct stat* stat_out = nullptr) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT)
        fail_hint(code, "check the path and the working directory", "file not found [{}]", path);
    if (fd < 0) fail(code, "cannot open the file: {} [{}]", errno_str(errno), path);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        fail(code, "cannot stat the file: {} [{}]", errno_str(err), path);
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(code, "not a regular file ({}) [{}]", file_type_name(st.st_mode), path);
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    if (stat_out != nullptr) *stat_out = st;
    return fd;
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path, ExitCode code, size_t writeback_window)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), code_(code), window_(writeback_window) {
    MT_CHECK(window_ > 0, "AtomicFileWriter: a writeback window of 0 bytes [{}]", path_);
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
    while (n > 0) {
        // At most to the end of the current writeback window, so that write_back() sees every window filled.
        const size_t piece = std::min<size_t>(n, window_ - bytes_ % window_);
        crc_ = core::crc32c(p, piece, crc_);
        for (size_t left = piece; left > 0;) {
            const ssize_t w = ::write(fd_, p, left);
            if (w < 0) {
                if (errno == EINTR) continue;
                fail_io("write");
            }
            p += w;
            left -= static_cast<size_t>(w);
        }
        bytes_ += piece;
        n -= piece;
        if (bytes_ % window_ == 0) write_back();
    }
}

void AtomicFileWriter::write_back() {
#ifdef __linux__
    // The window just filled starts its writeback now; the one before it is waited for. A checkpoint of tens of GB
    // otherwise sits dirty in memory until commit()'s fsync, and past the kernel's dirty limit every process that
    // writes a file is throttled (the training loop's metrics lines included). The written pages stay in the page
    // cache, clean: a restart on the same machine reads the checkpoint from memory. fsync still makes the whole
    // file durable; these calls only bound how much of it is dirty at a time (two windows), and their errors are
    // fsync's to report.
    const auto window = static_cast<off64_t>(window_);
    const auto end = static_cast<off64_t>(bytes_);
    ::sync_file_range(fd_, end - window, window, SYNC_FILE_RANGE_WRITE);
    if (end >= 2 * window) {
        ::sync_file_range(fd_,
                          end - 2 * window,
                          window,
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    }
#endif
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
    if (!S_ISREG(st.st_mode)) fail(code, "not a regular file ({}) [{}]", file_type_name(st.st_mode), path);
    return static_cast<uint64_t>(st.st_size);
}

uint32_t file_crc32c(const std::string& path, ExitCode code, size_t piece_bytes) {
    MT_CHECK(piece_bytes > 0, "file_crc32c: pieces of 0 bytes [{}]", path);
    // Pieces summed by the OpenMP threads and joined in order (crc32c_combine): a checkpoint file of tens of GB is
    // checked at the memory's (or the disk's) speed instead of one core's.
    struct stat st {};
    const int fd = open_read(path, code, &st);
    const auto size = static_cast<uint64_t>(st.st_size);
    const auto pieces = static_cast<int64_t>((size + piece_bytes - 1) / piece_bytes);
    std::vector<uint32_t> crcs(static_cast<size_t>(pieces), 0);
    std::vector<uint64_t> lengths(static_cast<size_t>(pieces), 0);  // what was read: less if the file shrank
    std::vector<int> errors(static_cast<size_t>(pieces), 0);
#pragma omp parallel for schedule(dynamic, 1) if (pieces > 1)
    for (int64_t i = 0; i < pieces; ++i) {
        const auto k = static_cast<size_t>(i);
        std::vector<char> buf(std::min<size_t>(piece_bytes, size_t{4} << 20));
        uint64_t at = k * piece_bytes;
        const uint64_t end = std::min<uint64_t>(size, at + piece_bytes);
        while (at < end) {
            const ssize_t r = ::pread(fd, buf.data(), std::min<uint64_t>(buf.size(), end - at), static_cast<off_t>(at));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) errors[k] = errno;
            if (r <= 0) break;
            crcs[k] = crc32c(buf.data(), static_cast<size_t>(r), crcs[k]);
            lengths[k] += static_cast<uint64_t>(r);
            at += static_cast<uint64_t>(r);
        }
    }
    ::close(fd);
    uint32_t crc = 0;
    for (size_t k = 0; k < crcs.size(); ++k) {
        if (errors[k] != 0) fail(code, "cannot read the file: {} [{}]", errno_str(errors[k]), path);
        crc = crc32c_combine(crc, crcs[k], lengths[k]);
    }
    return crc;
}

MappedFile::MappedFile(std::string path, ExitCode code) : path_(std::move(path)), code_(code) {
    const int fd = open_read(path_, code);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(code, "not a readable regular file [{}]", path_);
    }
    size_ = static_cast<size_t>(st.st_size);
    dev_ = static_cast<uint64_t>(st.st_dev);
    ino_ = static_cast<uint64_t>(st.st_ino);
    mtime_ns_ = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            fail(code, "cannot map the file: {} [{}]", errno_str(err), path_);
        }
        data_ = static_cast<const uint8_t*>(p);
        slot_ = signals_map_register(data_, size_, path_.c_str(), code);
    }
    ::close(fd);
}

MappedFile::~MappedFile() {
    signals_map_unregister(slot_);
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::check_unchanged() const {
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0)
        fail_hint(code_,
                  "restore the file, then resume with --resume",
                  "the file was removed or renamed while the run was using it: {} [{}]",
                  errno_str(errno),
                  path_);
    const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    std::string what;
    if (static_cast<uint64_t>(st.st_dev) != dev_ || static_cast<uint64_t>(st.st_ino) != ino_)
        what = "replaced by another file";
    else if (static_cast<size_t>(st.st_size) != size_)
        what = fmt::format("{} bytes when opened, {} now", size_, st.st_size);
    else if (mtime != mtime_ns_)
        what = "modified in place";
    if (what.empty()) return;
    fail_hint(code_,
              "never change a file that a run is using; restore it (or write new data under a new name), then "
              "resume with --resume",
              "the file changed while the run was using it ({}) [{}]",
              what,
              path_);
}

std::string host_name(std::string_view fallback) {
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return std::string(fallback);
    return name;
}

}  // namespace mt::core
