// Where a file goes on disk: which filesystem holds it and how much room it has, for the messages of a write
// that does not fit (a phone's or a laptop's disk fills up; the user must learn which disk and how much).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <cstddef>
#include <string>

namespace far {

// A file that could not be written: the disk is full, or it failed otherwise. The file's previous version,
// if any, is kept whole and nothing is left under its name.
struct WriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The folder holding `path` ("." for a bare name).
std::string folder_of(const std::string& path);

// "tmpfs mounted at /mnt/x (tmpfs)": the filesystem holding `dir`, by its mount point, type and source, as
// far as the system says (the mount point alone where /proc/self/mounts is unreadable).
std::string describe_disk(const std::string& dir);

// Bytes an unprivileged writer may still use on the filesystem holding `dir`; UINT64_MAX when unknown.
uint64_t free_bytes(const std::string& dir);

// The error for a write of `needed` bytes to `path` that found no room (`room` bytes left: UINT64_MAX when
// unknown), saying which disk, how much, and what became of `path`.
WriteError disk_full(const std::string& path, uint64_t needed, uint64_t room, bool path_existed);

// A file written atomically, piece by piece: `path`.tmp is written, then commit() fsyncs it, renames it onto
// `path` and fsyncs the folder, so `path` always holds either its previous version or the new one, whole.
// The room for `needed` bytes is asked of the filesystem first (a stale .tmp of a killed run counts as room);
// any failure throws WriteError (disk_full's message for a full disk), removing the .tmp and leaving `path`
// as it was. Destroyed without commit(), it removes the .tmp.
class AtomicFile {
 public:
  AtomicFile(const std::string& path, uint64_t needed);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void put(const void* data, size_t n);
  void commit();

 private:
  [[noreturn]] void fail(const char* what);
  std::string path_, tmp_, dir_;
  uint64_t needed_ = 0;
  bool existed_ = false;
  int fd_ = -1;
};

}  // namespace far
