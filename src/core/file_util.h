// File I/O that never leaves a half file: atomic writes (NAME.tmp, fsync, rename, fsync the directory),
// whole-file reads and read-only memory maps. Every failure is an Error naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"

namespace mt::core {

// Writes a file atomically: the bytes go to PATH.tmp, which is fsynced and renamed to PATH, and the directory is
// fsynced. On failure PATH is untouched (an older PATH stays as it was) and PATH.tmp is removed.
// @param[in] path   the final file name
// @param[in] bytes  the file's content
// @param[in] code   the exit code of the Error thrown on failure
void write_file_atomic(const std::string& path, std::string_view bytes, ExitCode code = ExitCode::checkpoint);
void write_file_atomic(const std::string& path, const void* data, size_t n, ExitCode code = ExitCode::checkpoint);

// Reads a whole file; fails with an Error naming the file when it is missing or unreadable.
std::string read_file(const std::string& path, ExitCode code = ExitCode::checkpoint);

// fsyncs a directory so that renames and unlinks inside it are durable.
void fsync_dir(const std::string& dir, ExitCode code = ExitCode::checkpoint);

// Size of a regular file in bytes; fails naming the file when it does not exist.
uint64_t file_size(const std::string& path, ExitCode code = ExitCode::checkpoint);

// CRC-32C of a whole file, any size: read in pieces of piece_bytes on the OpenMP threads, their CRCs joined in order.
uint32_t file_crc32c(const std::string& path,
                     ExitCode code = ExitCode::checkpoint,
                     size_t piece_bytes = size_t{64} << 20);

// Streaming atomic writer: write() appends to PATH.tmp; commit() fsyncs, renames to PATH and fsyncs the directory.
// Destroying it without commit() (an exception on the way) removes PATH.tmp, so no half file is left anywhere.
// It keeps the byte count and the CRC-32C of everything written, and the file's dirty pages bounded (write_back).
class AtomicFileWriter {
   public:
    // Bytes per writeback window: a file being written keeps at most two windows dirty in the page cache.
    static constexpr size_t kWritebackWindow = size_t{64} << 20;

    explicit AtomicFileWriter(std::string path,
                              ExitCode code = ExitCode::checkpoint,
                              size_t writeback_window = kWritebackWindow);
    ~AtomicFileWriter();
    AtomicFileWriter(const AtomicFileWriter&) = delete;
    AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

    // Appends n bytes to the temporary file.
    void write(const void* data, size_t n);
    void write(std::string_view bytes) {
        write(bytes.data(), bytes.size());
    }
    // Makes the file visible under its final name; call once, after the last write.
    void commit();

    uint64_t bytes() const {
        return bytes_;
    }
    uint32_t crc32c() const {
        return crc_;
    }
    const std::string& path() const {
        return path_;
    }

   private:
    [[noreturn]] void fail_io(const char* what);
    void write_back();  // after each full window: starts its writeback, waits for the one before it
    std::string path_;
    std::string tmp_path_;
    ExitCode code_;
    size_t window_;
    int fd_ = -1;
    uint64_t bytes_ = 0;
    uint32_t crc_ = 0;
    bool committed_ = false;
};

// A read-only memory map of a whole regular file (an empty file maps to no memory, size 0). The map is registered
// with core/signals.h, so a SIGBUS on it (the file shrank under the map) names the file and ends with `code`.
class MappedFile {
   public:
    explicit MappedFile(std::string path, ExitCode code = ExitCode::checkpoint);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const {
        return data_;
    }
    size_t size() const {
        return size_;
    }
    const std::string& path() const {
        return path_;
    }
    // Fails (the map's exit code, naming the file) when the path no longer holds the file that was mapped: another
    // inode (replaced by a rename), another size (truncated or rewritten) or another modification time (written in
    // place). A stat(2), cheap enough to call before every batch.
    void check_unchanged() const;

   private:
    std::string path_;
    ExitCode code_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    uint64_t dev_ = 0, ino_ = 0;
    int64_t mtime_ns_ = 0;
    int slot_ = -1;  // in the signal handler's table of maps
};

// This machine's name, as the files a run writes record it (a lock file's holder, a heartbeat, a TensorBoard file
// name); `fallback` when the system gives none.
std::string host_name(std::string_view fallback);

}  // namespace mt::core
