// Uncompressed tar files through libarchive (Debian's libarchive-dev): a member-by-member reader that records where
// each member's header starts, so that one member can be read again later without scanning the file (the WebDataset
// shards of docs/data.md "Image-text data"), and a writer for `moetrain data --images`. Damage is an input-data error
// (exit 3) naming the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct archive;

namespace mt::data {

// One regular file in a tar.
struct TarMember {
    std::string name;           // the path inside the tar
    int64_t header_offset = 0;  // byte offset of its first header block (a pax or GNU long-name header, if any)
    int64_t size = 0;           // bytes of data
};

// Reads the regular files of a tar in order; directories, links and other entries are passed over. Only plain
// (uncompressed) tar is accepted, in any of the ustar, pax or GNU dialects: a compressed tar cannot be read at random
// places, which the dataset needs.
class TarReader {
   public:
    // Opens the tar at path, reading from header_offset on (0: the whole file). Throws Error(ExitCode::data) naming
    // the path when it is missing, not a regular file, or not an uncompressed tar.
    // @param[in] path           the tar file
    // @param[in] header_offset  where reading starts: 0, or a TarMember::header_offset of this file
    explicit TarReader(const std::string& path, int64_t header_offset = 0);
    ~TarReader();
    TarReader(const TarReader&) = delete;
    TarReader& operator=(const TarReader&) = delete;

    // Moves to the next regular file. Returns false at the end of the archive. Reading from offset 0, the end must be
    // the end-of-archive marker (two zero blocks): a file that stops without one, or inside a header or a member's
    // data, throws Error(ExitCode::data) "truncated tar ... [path]".
    // @param[out] member  the member's name, header offset and size
    bool next(TarMember* member);

    // The current member's data, or its first max_bytes bytes (max_bytes < 0: all). Throws Error(ExitCode::data)
    // naming the path when the file ends inside the data.
    // @param[in] max_bytes  the most bytes to return; < 0 for all
    std::vector<uint8_t> read(int64_t max_bytes = -1);

    const std::string& path() const {
        return path_;
    }

    // The file under libarchive (tar_archive.cpp); public for its C callbacks.
    struct Source;

   private:
    [[noreturn]] void fail_archive(const char* doing);
    std::string path_;
    std::unique_ptr<Source> source_;
    ::archive* archive_ = nullptr;
    int64_t start_ = 0;  // the header offset reading started at: libarchive counts positions from there
};

// Reads the data of the member whose header starts at header_offset and checks that it is named `name`. Throws
// Error(ExitCode::data) naming the path when the file changed or ends early.
// @param[in] path           the tar file
// @param[in] header_offset  TarMember::header_offset from a reader over the same file
// @param[in] name           TarMember::name, checked
std::vector<uint8_t> tar_read_member(const std::string& path, int64_t header_offset, const std::string& name);

// Writes a tar (pax dialect, plain ustar headers wherever the name fits) to path.tmp and renames it to path on
// finish(), so an interrupted write never leaves a half file under the final name. Members get mode 0644, owner 0 and
// mtime 0, so the same members always give the same bytes. Errors throw Error(ExitCode::data) naming the path.
class TarWriter {
   public:
    // @param[in] path  the tar to write; its directory must exist
    explicit TarWriter(std::string path);
    ~TarWriter();  // without finish(): removes path.tmp
    TarWriter(const TarWriter&) = delete;
    TarWriter& operator=(const TarWriter&) = delete;

    // Appends a regular file.
    // @param[in] name  its path inside the tar
    // @param[in] data  its bytes
    void add(const std::string& name, const std::vector<uint8_t>& data);
    // Writes the end-of-archive marker and renames path.tmp to path.
    void finish();

   private:
    std::string path_;
    ::archive* archive_ = nullptr;
};

}  // namespace mt::data
