#include "far/disk.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <climits>
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

}  // namespace far
