// kvconv dump writer: record groups (64-byte header + payload padded to 8) written atomically (tmp + rename).
// Pure C++17, no CUDA: shared by the tracer and by the host-only test program that CI builds.
// Layouts come from the generated include/kvconv_records.h (schemas/layouts.json); no offsets are written here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvconv_records.h"

namespace kvconv {

uint32_t crc32(const void* data, size_t len, uint32_t crc = 0);  // zlib-compatible CRC-32

struct GroupSpec {
  uint16_t kind = 0;          // KVCONV_KIND_*
  uint32_t record_size = 0;   // bytes per record
  uint64_t record_count = 0;
  uint64_t capacity = 0;
  uint64_t drop_count = 0;
  uint32_t context_id = 0;
  uint16_t device_id = 0;
  uint16_t clock_domain = KVCONV_CLOCK_DOMAIN_NONE;
};

kvconv_header_t make_header(const GroupSpec& g, uint32_t payload_crc32);

class DumpWriter {
 public:
  // Groups are appended to a temporary file beside `path`; commit() renames it into place.
  explicit DumpWriter(std::string path);
  ~DumpWriter();  // removes the temporary file unless committed
  bool ok() const { return fd_ >= 0 && !failed_; }
  const std::string& error() const { return error_; }
  bool add_group(const GroupSpec& g, const void* payload);  // payload = record_count * record_size bytes
  bool add_bytes(uint16_t kind, const std::string& bytes, uint32_t context_id, uint16_t device_id);
  bool commit();  // fsync + rename; false (and error()) on failure

 private:
  bool write_all(const void* p, size_t n);
  std::string path_, tmp_, error_;
  int fd_ = -1;
  bool failed_ = false, committed_ = false;
};

// Check at start-up that `path` can be written (its folder exists and is writable). Empty string = fine.
std::string check_writable(const std::string& path);

// Expand %p (pid), %c (context index) and %% in an output path pattern.
std::string expand_path(const std::string& pattern, long pid, int context);

// Minimal JSON string escaping for metadata.
std::string json_escape(const std::string& s);

}  // namespace kvconv
