#include "live_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace kvconv {

void (*g_live_step)() = nullptr;
static inline void step() {
  if (g_live_step) g_live_step();
}

static uint64_t padded(uint64_t n) { return (n + KVCONV_PAYLOAD_ALIGN - 1) / KVCONV_PAYLOAD_ALIGN * KVCONV_PAYLOAD_ALIGN; }

kvconv_header_t make_live_header(const GroupSpec& g) {
  GroupSpec s = g;
  s.record_count = 0;
  s.drop_count = 0;
  kvconv_header_t h = make_header(s, 0);
  h.flags = KVCONV_HEADER_FLAGS_LIVE;
  // the live flag is minor 1's: a 1.0 reader warns (newer minor) instead of guessing; a newer kind keeps its own
  // (the write canary's groups: 2)
  h.minor = kvconv_kind_minor(g.kind) > KVCONV_MINOR_LIVE ? kvconv_kind_minor(g.kind) : KVCONV_MINOR_LIVE;
  h.header_crc32 = crc32(&h, offsetof(kvconv_header_t, header_crc32));  // the volatile fields are 0 here
  return h;
}

void LiveGroup::sub_drops(uint64_t n) {
  uint64_t cur = __atomic_load_n(&h_->drop_count, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(&h_->drop_count, &cur, cur > n ? cur - n : 0, false, __ATOMIC_RELEASE,
                                      __ATOMIC_RELAXED)) {
  }
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

bool LiveGroup::backed(uint64_t n) const {
  if (!h_) return false;
  n = n < capacity() ? n : capacity();
  return !f_ || f_->grow_to(off_ + n * record_size());
}

bool LiveGroup::populate(uint64_t from, uint64_t to) const {
  if (!h_) return false;
  to = to < capacity() ? to : capacity();
  if (from >= to) return true;
  if (!backed(to)) return false;  // pages past the end of the file cannot be populated
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(at(from)) / page * page;
  const uintptr_t b = reinterpret_cast<uintptr_t>(at(to));
  return madvise(reinterpret_cast<void*>(a), b - a, MADV_POPULATE_WRITE) == 0;
}

bool LiveGroup::put(const void* recs, uint64_t n) {
  const uint64_t c = count();
  if (c + n > capacity() || !backed(c + n)) {
    add_drops(n);
    return false;
  }
  std::memcpy(at(c), recs, n * record_size() / 2);
  step();  // a record half-written
  std::memcpy(at(c) + n * record_size() / 2, static_cast<const uint8_t*>(recs) + n * record_size() / 2,
              n * record_size() - n * record_size() / 2);
  step();
  advance(c, c + n);
  step();
  return true;
}

bool LiveGroup::append_marked(const void* rec, uint32_t marker_off, uint64_t* next) {
  const uint64_t i = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
  step();
  add_drops(1);  // possibly lost until published (a row being written when the process dies)
  step();
  if (i >= capacity() || !backed(i + 1)) return false;  // full: stays counted as a drop
  uint8_t* row = at(i);
  uint32_t marker;
  std::memcpy(&marker, static_cast<const uint8_t*>(rec) + marker_off, sizeof marker);
  std::memcpy(row, rec, marker_off);
  step();
  std::memcpy(row + marker_off + 4, static_cast<const uint8_t*>(rec) + marker_off + 4,
              record_size() - marker_off - 4);
  __atomic_store_n(reinterpret_cast<uint32_t*>(row + marker_off), marker, __ATOMIC_RELEASE);
  step();
  publish_marked(marker_off);
  return true;
}

void LiveGroup::publish_marked(uint32_t marker_off) {
  // Whoever finds the next row marked moves the count over it (and takes it off the possibly-lost count); a row
  // written out of order is published by the writer of the row before it.
  uint64_t p = count();
  while (p < capacity() && __atomic_load_n(reinterpret_cast<uint32_t*>(at(p) + marker_off), __ATOMIC_ACQUIRE)) {
    if (advance(p, p + 1)) {
      step();
      sub_drops(1);
      ++p;
    } else {
      p = count();
    }
  }
}

LiveFile::~LiveFile() {
  for (auto& m : maps_) munmap(m.first, m.second);
  if (fd_ >= 0) ::close(fd_);
}

static bool pwrite_all(int fd, const void* p, size_t n, uint64_t off) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::pwrite(fd, c, n, static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    c += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return true;
}

bool LiveFile::create(const std::string& path, const std::string& metadata_json) {
  std::lock_guard<std::mutex> lk(mu_);
  path_ = path;
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".tmp.%ld", static_cast<long>(getpid()));
  const std::string tmp = path + suffix;
  fd_ = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    error_ = "cannot create " + tmp + ": " + std::strerror(errno);
    return false;
  }
  GroupSpec g;
  g.kind = KVCONV_KIND_METADATA;
  g.record_size = 1;
  g.record_count = metadata_json.size();
  const kvconv_header_t h = make_header(g, crc32(metadata_json.data(), metadata_json.size()));
  static const char zeros[8] = {0};
  const uint64_t n = metadata_json.size();
  bool ok = pwrite_all(fd_, &h, sizeof h, 0) && pwrite_all(fd_, metadata_json.data(), n, sizeof h) &&
            pwrite_all(fd_, zeros, padded(n) - n, sizeof h + n);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    error_ = "cannot write " + path + ": " + std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp.c_str());
    return false;
  }
  size_ = disk_ = sizeof h + padded(n);
  return true;
}

// Growth steps: at least kGrowMin bytes, or an eighth of the file (few ftruncate calls for a large table).
static const uint64_t kGrowMin = 1 << 20;

bool LiveFile::grow_to(uint64_t end) {
  if (end <= disk_size()) return true;
  std::lock_guard<std::mutex> lk(mu_);
  if (end <= disk_) return true;
  if (fd_ < 0 || end > size_) return false;
  uint64_t to = std::max(end, disk_ + std::max(kGrowMin, disk_ / 8));
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  to = std::min(size_, (to + page - 1) / page * page);
  if (::ftruncate(fd_, static_cast<off_t>(to)) != 0) {  // a sparse hole of zeros until written
    error_ = "cannot extend " + path_ + ": " + std::strerror(errno);
    return false;
  }
  __atomic_store_n(&disk_, to, __ATOMIC_RELEASE);
  return true;
}

bool LiveFile::add_groups(const std::vector<GroupSpec>& specs, std::vector<LiveGroup>* out) {
  std::lock_guard<std::mutex> lk(mu_);
  if (fd_ < 0 || specs.empty()) return false;
  const uint64_t start = size_;
  std::vector<uint64_t> offs;
  uint64_t pos = start;
  for (const GroupSpec& g : specs) {
    const kvconv_header_t h = make_live_header(g);
    if (!pwrite_all(fd_, &h, sizeof h, pos)) {  // extends the file by this header only
      error_ = "cannot extend " + path_ + ": " + std::strerror(errno);
      return false;
    }
    step();
    offs.push_back(pos);
    pos += sizeof h + padded(g.capacity * g.record_size);
  }
  // The headers are on disk (each pwrite extended the file); the last group's payload is not: it grows as records
  // are written (grow_to). Until then the group reserves space past the end of the file, which readers accept for
  // a live group (nothing is published there).
  __atomic_store_n(&disk_, std::max(disk_, offs.back() + sizeof(kvconv_header_t)), __ATOMIC_RELEASE);
  step();
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t base = start / page * page;
  const size_t len = static_cast<size_t>(pos - base);
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, static_cast<off_t>(base));
  if (m == MAP_FAILED) {
    error_ = "cannot map " + path_ + ": " + std::strerror(errno);
    return false;
  }
  maps_.push_back({m, len});
  size_ = pos;
  uint8_t* b = static_cast<uint8_t*>(m) - base;
  for (uint64_t off : offs)
    out->push_back(LiveGroup(reinterpret_cast<kvconv_header_t*>(b + off), b + off + KVCONV_HEADER_SIZE, this,
                             off + KVCONV_HEADER_SIZE));
  return true;
}

}  // namespace kvconv
