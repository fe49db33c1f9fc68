// The dump file is the buffer: a kvconv dump that is valid on disk at every step while the traced process runs, so
// that any end of the process (os._exit, abort, SIGKILL, the OOM killer) leaves a readable dump behind.
// Pure C++17, no CUDA: shared by the tracer and by the host-only tests (tests/host_dump_test.cpp, tests/live_test.cpp).
//
// Layout (schemas/layouts.json, header flag `live`): the file starts with a finished metadata group; every further
// group is *live*: its header is written once, before the file grows past it, and reserves `capacity` records of
// payload (the next group follows that reservation; unwritten space is a sparse hole of zeros). The last group's
// reservation is not on disk: the file grows (ftruncate, in chunks) just before records are written there, so a
// live file holds what was published plus one chunk, not the reservation (a 2 GiB device buffer was a 2 GiB file). While the process
// runs only two header fields change, each with one aligned 8-byte store into a MAP_SHARED mapping of the file:
//   record_count  records published (complete; written before the count moves past them)
//   drop_count    records possibly lost: overflow, rows being written, device events not yet copied out
// header_crc32 is taken with both (and payload_crc32, always 0 here) as zero, so the header checks at every instant.
// Writes to a shared file mapping are in the page cache the moment they are made: a process killed at any
// instruction leaves everything it published, and the kernel writes it back as for any file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "dump_writer.h"

namespace kvconv {

class LiveFile;

kvconv_header_t make_live_header(const GroupSpec& g);

// Fault-injection point for the host-only test (tests/live_test.cpp kills itself at step k to check the file after
// every step); NULL in the tracer.
extern void (*g_live_step)();  // record_count, drop_count, payload_crc32 = 0

// One live group: its header and reserved payload inside the file mapping. Copyable handle; the file owns the memory.
class LiveGroup {
 public:
  LiveGroup() = default;
  LiveGroup(kvconv_header_t* h, uint8_t* payload, LiveFile* f = nullptr, uint64_t off = 0)
      : h_(h), p_(payload), f_(f), off_(off) {}
  bool valid() const { return h_ != nullptr; }
  uint64_t capacity() const { return h_ ? h_->capacity : 0; }
  uint32_t record_size() const { return h_->record_size; }
  uint8_t* at(uint64_t i) const { return p_ + i * h_->record_size; }
  uint64_t count() const { return h_ ? __atomic_load_n(&h_->record_count, __ATOMIC_ACQUIRE) : 0; }
  uint64_t drops() const { return h_ ? __atomic_load_n(&h_->drop_count, __ATOMIC_ACQUIRE) : 0; }
  // Move the published count from `from` to `to` (records [from, to) already written). False if another thread
  // moved it first. Release: a reader that sees the count sees the records.
  bool advance(uint64_t from, uint64_t to) {
    return __atomic_compare_exchange_n(&h_->record_count, &from, to, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
  }
  void add_drops(uint64_t n) { __atomic_fetch_add(&h_->drop_count, n, __ATOMIC_RELEASE); }
  void sub_drops(uint64_t n);  // saturating at 0
  void set_drops(uint64_t n) { __atomic_store_n(&h_->drop_count, n, __ATOMIC_RELEASE); }

  // Records [0, n) (clamped to the capacity) are on disk: the file grown if they lie past its end (the last
  // group). Call before writing records there; a write past the end of the file would be SIGBUS. False if the file
  // cannot grow.
  bool backed(uint64_t n) const;
  // Page in records [from, to) (clamped to the capacity) for writing, without changing a byte
  // (MADV_POPULATE_WRITE, Linux 5.14+): a later write there takes no page fault (~3.5 us each in a Firecracker VM,
  // one per 42 host rows). Safe beside concurrent writers. False if the kernel cannot.
  bool populate(uint64_t from, uint64_t to) const;
  // Single writer (caller holds its own lock): copy n records to the end, publish them. False when full.
  bool put(const void* recs, uint64_t n);
  // Many writers, lock-free: reserve a row from `next`, write it with the u32 at `marker_off` (never 0 in a valid
  // record) stored last, then publish the contiguous prefix of marked rows. A reserved row counts as possibly lost
  // until it is published; a full table counts a drop. False when full.
  bool append_marked(const void* rec, uint32_t marker_off, uint64_t* next);

 private:
  void publish_marked(uint32_t marker_off);
  kvconv_header_t* h_ = nullptr;
  uint8_t* p_ = nullptr;
  LiveFile* f_ = nullptr;
  uint64_t off_ = 0;  // file offset of the payload
};

class LiveFile {
 public:
  LiveFile() = default;
  LiveFile(const LiveFile&) = delete;
  LiveFile& operator=(const LiveFile&) = delete;
  ~LiveFile();  // unmaps; the file stays
  // Create `path` holding one finished metadata group, atomically (temporary name, then rename): from its first
  // instant the file is a valid dump.
  bool create(const std::string& path, const std::string& metadata_json);
  // Append one live group per spec (capacity records reserved, nothing published). Each header is written before
  // the file grows past it: a process dying half-way leaves a valid dump whose last group reserves space past the
  // end of the file (readers accept that for live groups: nothing is published there).
  bool add_groups(const std::vector<GroupSpec>& specs, std::vector<LiveGroup>* out);
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }
  bool ok() const { return fd_ >= 0; }
  // The file holds at least `end` bytes (grown in chunks, never past the reservations). False if it cannot grow.
  bool grow_to(uint64_t end);
  uint64_t disk_size() const { return __atomic_load_n(&disk_, __ATOMIC_ACQUIRE); }

 private:
  std::mutex mu_;
  int fd_ = -1;
  uint64_t size_ = 0;  // end of the last reservation
  uint64_t disk_ = 0;  // length of the file (<= size_): what is on disk
  std::string path_, error_;
  std::vector<std::pair<void*, size_t>> maps_;
};

}  // namespace kvconv
