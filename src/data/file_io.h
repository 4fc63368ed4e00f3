// Small file helpers for the data pipeline: a read-only memory map and an atomic writer (NAME.tmp, fsync,
// rename), so readers never see a half-written file (conventions §3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mt::data {

// A whole file mapped read-only. Missing or unreadable files throw Error(ExitCode::data) naming the file.
class MappedFile {
   public:
    explicit MappedFile(const std::string& path);
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

   private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

// Writes PATH.tmp and renames it to PATH on commit() (after fsync of the file and its directory). If the
// writer is destroyed without commit(), the temporary file is removed. Failures throw Error(ExitCode::data).
class AtomicFile {
   public:
    explicit AtomicFile(std::string path);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const void* data, size_t bytes);
    void write(std::string_view text) {
        write(text.data(), text.size());
    }
    void commit();

   private:
    std::string path_;
    std::string tmp_path_;
    int fd_ = -1;
};

// Writes a whole file atomically.
void file_write_atomic(const std::string& path, std::string_view contents);

}  // namespace mt::data
