#include "far/disk.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace far {

namespace {

// /proc/self/mounts writes a space as \040, a tab as \011, a newline as \012 and a backslash as \134.
std::string unescape_mount(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const std::string oct = s.substr(i + 1, 3);
      if (oct.find_first_not_of("01234567") == std::string::npos) {
        out += static_cast<char>(std::strtol(oct.c_str(), nullptr, 8));
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// The mount point of the filesystem holding `dir`: its highest ancestor on the same device.
std::string mount_point(const std::string& dir) {
  char resolved[PATH_MAX];
  if (!::realpath(dir.c_str(), resolved)) return dir;
  std::string path = resolved;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return path;
  while (path != "/") {
    const size_t slash = path.rfind('/');
    const std::string parent = slash == 0 ? "/" : path.substr(0, slash);
    struct stat up;
    if (::stat(parent.c_str(), &up) != 0 || up.st_dev != st.st_dev) break;
    path = parent;
  }
  return path;
}

}  // namespace

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string describe_disk(const std::string& dir) {
  const std::string mount = mount_point(dir);
  std::ifstream mounts("/proc/self/mounts");
  std::string line, found;
  while (std::getline(mounts, line)) {  // the last line for a mount point is the one on top
    std::istringstream fields(line);
    std::string source, point, type;
    if (fields >> source >> point >> type && unescape_mount(point) == mount)
      found = type + " filesystem '" + unescape_mount(source) + "'";
  }
  return "the disk mounted at " + mount + (found.empty() ? "" : " (" + found + ")");
}

uint64_t free_bytes(const std::string& dir) {
  struct statvfs st;
  if (::statvfs(dir.c_str(), &st) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(st.f_bavail) * static_cast<uint64_t>(st.f_frsize);
}

WriteError disk_full(const std::string& path, uint64_t needed, uint64_t room, bool path_existed) {
  const std::string dir = folder_of(path);
  return WriteError("no space left on " + describe_disk(dir) + " to write " + path + ": it needs " +
                    std::to_string(needed) + " bytes, " +
                    (room == UINT64_MAX ? std::string("fewer are") : std::to_string(room) + " bytes are") +
                    " free there; " + path +
                    (path_existed ? " keeps its previous version, unchanged" : " was not written") +
                    ". Free space on that disk, or write to a folder on another one");
}

AtomicFile::AtomicFile(const std::string& path, uint64_t needed)
    : path_(path), tmp_(path + ".tmp"), dir_(folder_of(path)), needed_(needed) {
  // Nothing is changed under `path` until the whole new file is on disk: a write that finds no room stops,
  // removes its .tmp and says which disk and how much (a stale .tmp of a killed run is room we get back).
  struct stat st;
  existed_ = ::stat(path.c_str(), &st) == 0;
  const uint64_t stale = ::stat(tmp_.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  uint64_t room = free_bytes(dir_);
  if (room != UINT64_MAX) room += stale;
  if (room != UINT64_MAX && room < needed) throw disk_full(path, needed, room, existed_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) throw WriteError(tmp_ + ": cannot create: " + std::strerror(errno) + "; " + path + " is unchanged");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

// A failed write, fsync or close: no partial file is left, and the message names the cause.
void AtomicFile::fail(const char* what) {
  const int err = errno;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  if (err == ENOSPC || err == EDQUOT) throw disk_full(path_, needed_, free_bytes(dir_), existed_);
  throw WriteError(tmp_ + ": " + what + ": " + std::strerror(err) + "; " + path_ + " is unchanged");
}

void AtomicFile::put(const void* data, size_t n) {
  auto c = static_cast<const char*>(data);
  while (n) {
    const ssize_t w = ::write(fd_, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = ENOSPC;  // a write that takes nothing has found no room
      fail("write failed");
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("fsync failed");
  const int fd = fd_;
  fd_ = -1;  // closed here, whatever close says
  if (::close(fd) != 0) fail("close failed");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("rename failed");
  const int dfd = ::open(dir_.c_str(), O_RDONLY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace far
