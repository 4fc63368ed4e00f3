// Tar reading and writing through libarchive (tar_archive.h). The reader feeds libarchive from pread(2) at its own
// position, so it can start at any member's header and skip member data without reading it.
#include "data/tar_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/file_util.h"

namespace mt::data {

// The file libarchive reads: a descriptor, the next byte to hand out, the size, and one buffer.
struct TarReader::Source {
    int fd = -1;
    int64_t pos = 0;
    int64_t size = 0;
    std::vector<uint8_t> buffer = std::vector<uint8_t>(1 << 16);
    int error = 0;  // errno of a failed pread
};

namespace {

la_ssize_t tar_source_read(archive*, void* data, const void** out) {
    auto* s = static_cast<TarReader::Source*>(data);
    const int64_t want = std::min<int64_t>(std::ssize(s->buffer), s->size - s->pos);
    if (want <= 0) return 0;
    const ssize_t got = ::pread(s->fd, s->buffer.data(), static_cast<size_t>(want), s->pos);
    if (got < 0) {
        s->error = errno;
        return -1;
    }
    s->pos += got;
    *out = s->buffer.data();
    return got;
}

// Skips at most to the end of the file; libarchive reports a member cut short by the end as a truncated archive.
la_int64_t tar_source_skip(archive*, void* data, la_int64_t request) {
    auto* s = static_cast<TarReader::Source*>(data);
    const int64_t n = std::max<int64_t>(0, std::min<int64_t>(request, s->size - s->pos));
    s->pos += n;
    return n;
}

}  // namespace

TarReader::TarReader(const std::string& path, int64_t header_offset)
    : path_(path), source_(std::make_unique<Source>()), start_(header_offset) {
    source_->size = static_cast<int64_t>(core::file_size(path, core::ExitCode::data));
    source_->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (source_->fd < 0) core::fail(core::ExitCode::data, "cannot open tar shard: {} [{}]", std::strerror(errno), path);
    MT_CHECK(header_offset >= 0 && header_offset <= source_->size,
             "tar header offset {} outside {} ({} bytes)",
             header_offset,
             path,
             source_->size);
    source_->pos = header_offset;
    archive_ = archive_read_new();
    MT_CHECK(archive_ != nullptr, "archive_read_new failed");
    archive_read_support_format_tar(archive_);  // ustar, pax and GNU; no compression filter: plain tar only
    archive_read_set_read_callback(archive_, tar_source_read);
    archive_read_set_skip_callback(archive_, tar_source_skip);
    archive_read_set_callback_data(archive_, source_.get());
    if (archive_read_open1(archive_) != ARCHIVE_OK) fail_archive("opening it");
}

TarReader::~TarReader() {
    if (archive_ != nullptr) archive_read_free(archive_);
    if (source_ && source_->fd >= 0) ::close(source_->fd);
}

void TarReader::fail_archive(const char* doing) {
    const char* what = archive_error_string(archive_);
    std::string message = what != nullptr ? what : "unknown libarchive error";
    if (source_->error != 0) message += std::string(" (") + std::strerror(source_->error) + ")";
    const bool unrecognized = message.find("Unrecognized archive format") != std::string::npos;
    core::fail_hint(core::ExitCode::data,
                    unrecognized ? "tar shards must be plain, uncompressed tar files (decompress a .tar.gz first)"
                                 : "the shard is damaged or was cut short; rewrite it or remove it from the paths",
                    "{} tar shard: libarchive stopped while {}: {} [{}]",
                    unrecognized ? "not a tar file: the" : "truncated or damaged",
                    doing,
                    message,
                    path_);
}

bool TarReader::next(TarMember* member) {
    for (;;) {
        archive_entry* entry = nullptr;
        const int r = archive_read_next_header(archive_, &entry);
        if (r == ARCHIVE_EOF) {
            // libarchive accepts a file that stops at a member boundary without the end-of-archive marker (some
            // writers omit it); every tar writer moetrain knows writes it, so here its absence means a cut file.
            if (start_ != 0) return false;
            const int64_t size = source_->size;
            std::vector<uint8_t> tail(static_cast<size_t>(std::min<int64_t>(size, 1024)));
            const bool read_ok =
                ::pread(source_->fd, tail.data(), tail.size(), size - std::ssize(tail)) == std::ssize(tail);
            const bool zero = std::all_of(tail.begin(), tail.end(), [](uint8_t b) { return b == 0; });
            if (size % 512 != 0 || tail.size() < 1024 || !read_ok || !zero)
                core::fail_hint(core::ExitCode::data,
                                "the shard was cut short; rewrite it or remove it from the paths",
                                "truncated tar shard: it ends after {} bytes without the end-of-archive marker (two "
                                "zero 512-byte blocks) [{}]",
                                size,
                                path_);
            return false;
        }
        if (r < ARCHIVE_WARN) fail_archive("reading a member's header");
        if (archive_entry_filetype(entry) != AE_IFREG) continue;
        member->name = archive_entry_pathname(entry) != nullptr ? archive_entry_pathname(entry) : "";
        member->header_offset = start_ + archive_read_header_position(archive_);
        member->size = archive_entry_size(entry);
        return true;
    }
}

std::vector<uint8_t> TarReader::read(int64_t max_bytes) {
    std::vector<uint8_t> out;
    std::vector<uint8_t> chunk(1 << 16);
    for (;;) {
        if (max_bytes >= 0 && std::ssize(out) >= max_bytes) break;
        const la_ssize_t n = archive_read_data(archive_, chunk.data(), chunk.size());
        if (n < 0) fail_archive("reading a member's data");
        if (n == 0) break;
        out.insert(out.end(), chunk.begin(), chunk.begin() + n);
    }
    if (max_bytes >= 0 && std::ssize(out) > max_bytes) out.resize(static_cast<size_t>(max_bytes));
    return out;
}

std::vector<uint8_t> tar_read_member(const std::string& path, int64_t header_offset, const std::string& name) {
    TarReader reader(path, header_offset);
    TarMember member;
    if (!reader.next(&member) || member.name != name || member.header_offset != header_offset)
        core::fail_hint(core::ExitCode::data,
                        "the shard changed after it was indexed at the start of the run; restart the run",
                        "tar shard: no member \"{}\" at byte {} any more [{}]",
                        name,
                        header_offset,
                        path);
    std::vector<uint8_t> data = reader.read();
    if (std::ssize(data) != member.size)
        core::fail(core::ExitCode::data,
                   "truncated tar shard: member \"{}\" holds {} of its {} bytes [{}]",
                   name,
                   data.size(),
                   member.size,
                   path);
    return data;
}

TarWriter::TarWriter(std::string path) : path_(std::move(path)) {
    archive_ = archive_write_new();
    MT_CHECK(archive_ != nullptr, "archive_write_new failed");
    archive_write_set_format_pax_restricted(archive_);
    if (archive_write_open_filename(archive_, (path_ + ".tmp").c_str()) != ARCHIVE_OK)
        core::fail(core::ExitCode::data,
                   "cannot write tar shard: {} [{}]",
                   archive_error_string(archive_) ? archive_error_string(archive_) : "?",
                   path_);
}

TarWriter::~TarWriter() {
    if (archive_ == nullptr) return;
    archive_write_free(archive_);  // closes the file; the half shard goes
    ::unlink((path_ + ".tmp").c_str());
}

void TarWriter::add(const std::string& name, const std::vector<uint8_t>& data) {
    MT_CHECK(archive_ != nullptr, "tar writer of {} used after finish()", path_);
    archive_entry* entry = archive_entry_new();
    archive_entry_set_pathname(entry, name.c_str());
    archive_entry_set_size(entry, static_cast<la_int64_t>(data.size()));
    archive_entry_set_filetype(entry, AE_IFREG);
    archive_entry_set_perm(entry, 0644);
    archive_entry_set_mtime(entry, 0, 0);
    const bool ok = archive_write_header(archive_, entry) == ARCHIVE_OK &&
                    (data.empty() || archive_write_data(archive_, data.data(), data.size()) == std::ssize(data));
    archive_entry_free(entry);
    if (!ok)
        core::fail(core::ExitCode::data,
                   "cannot write member \"{}\" of tar shard: {} [{}]",
                   name,
                   archive_error_string(archive_) ? archive_error_string(archive_) : "?",
                   path_);
}

void TarWriter::finish() {
    MT_CHECK(archive_ != nullptr, "tar writer of {} finished twice", path_);
    const bool ok = archive_write_close(archive_) == ARCHIVE_OK;
    const std::string error = archive_error_string(archive_) ? archive_error_string(archive_) : "?";
    archive_write_free(archive_);
    archive_ = nullptr;
    if (!ok) {
        ::unlink((path_ + ".tmp").c_str());
        core::fail(core::ExitCode::data, "cannot finish tar shard: {} [{}]", error, path_);
    }
    if (std::rename((path_ + ".tmp").c_str(), path_.c_str()) != 0)
        core::fail(core::ExitCode::data, "cannot rename {}.tmp: {} [{}]", path_, std::strerror(errno), path_);
}

}  // namespace mt::data
