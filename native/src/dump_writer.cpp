#include "dump_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvconv {

static uint32_t g_crc_table[256];
static bool g_crc_init = [] {
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    g_crc_table[i] = c;
  }
  return true;
}();

uint32_t crc32(const void* data, size_t len, uint32_t crc) {
  (void)g_crc_init;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < len; ++i) crc = g_crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

kvconv_header_t make_header(const GroupSpec& g, uint32_t payload_crc32) {
  kvconv_header_t h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, KVCONV_MAGIC, 8);  // 7 chars + NUL
  h.major = KVCONV_MAJOR;
  h.minor = kvconv_kind_minor(g.kind);  // finished groups: 1.0 unless their kind is newer (layouts.json)
  h.record_kind = g.kind;
  h.header_size = KVCONV_HEADER_SIZE;
  h.record_size = g.record_size;
  h.flags = 0;
  h.record_count = g.record_count;
  h.capacity = g.capacity;
  h.drop_count = g.drop_count;
  h.context_id = g.context_id;
  h.device_id = g.device_id;
  h.clock_domain = g.clock_domain;
  h.payload_crc32 = payload_crc32;
  h.header_crc32 = crc32(&h, offsetof(kvconv_header_t, header_crc32));
  return h;
}

DumpWriter::DumpWriter(std::string path) : path_(std::move(path)) {
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".tmp.%ld", static_cast<long>(getpid()));
  tmp_ = path_ + suffix;
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) error_ = "cannot create " + tmp_ + ": " + std::strerror(errno);
}

DumpWriter::~DumpWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

bool DumpWriter::write_all(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::write(fd_, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      error_ = "write " + tmp_ + ": " + std::strerror(errno);
      failed_ = true;
      return false;
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool DumpWriter::add_group(const GroupSpec& g, const void* payload) {
  if (!ok()) return false;
  const size_t n = static_cast<size_t>(g.record_count) * g.record_size;
  const uint32_t crc = n ? crc32(payload, n) : 0;
  kvconv_header_t h = make_header(g, crc);
  if (!write_all(&h, sizeof h)) return false;
  if (n && !write_all(payload, n)) return false;
  static const char zeros[8] = {0};
  const size_t pad = (KVCONV_PAYLOAD_ALIGN - n % KVCONV_PAYLOAD_ALIGN) % KVCONV_PAYLOAD_ALIGN;
  return pad ? write_all(zeros, pad) : true;
}

bool DumpWriter::add_bytes(uint16_t kind, const std::string& bytes, uint32_t context_id, uint16_t device_id) {
  GroupSpec g;
  g.kind = kind;
  g.record_size = 1;
  g.record_count = bytes.size();
  g.context_id = context_id;
  g.device_id = device_id;
  return add_group(g, bytes.data());
}

bool DumpWriter::commit() {
  if (!ok()) return false;
  if (::fsync(fd_) != 0 && errno != EINVAL) {
    error_ = "fsync " + tmp_ + ": " + std::strerror(errno);
    return false;
  }
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    error_ = "rename " + tmp_ + " -> " + path_ + ": " + std::strerror(errno);
    return false;
  }
  committed_ = true;
  return true;
}

std::string check_writable(const std::string& path) {
  std::string dir = ".";
  auto slash = path.rfind('/');
  if (slash != std::string::npos) dir = slash == 0 ? "/" : path.substr(0, slash);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return "output folder " + dir + " does not exist";
  if (!S_ISDIR(st.st_mode)) return dir + " is not a folder";
  struct stat pst;
  if (::stat(path.c_str(), &pst) == 0 && S_ISDIR(pst.st_mode)) return path + " is a folder";
  std::string probe = path + ".probe." + std::to_string(static_cast<long>(getpid()));
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot write in " + dir + ": " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

std::string expand_path(const std::string& pattern, long pid, int context) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '%' && i + 1 < pattern.size()) {
      char n = pattern[i + 1];
      if (n == 'p') { out += std::to_string(pid); ++i; continue; }
      if (n == 'c') { out += std::to_string(context); ++i; continue; }
      if (n == '%') { out += '%'; ++i; continue; }
    }
    out += c;
  }
  return out;
}

std::string json_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size() + 2);
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          o += b;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o;
}

}  // namespace kvconv
