#include "far/pages.h"

#if defined(__linux__)
#include <limits.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#endif

namespace far {

FilePages::FilePages(const std::vector<std::string>& paths) {
#if defined(__linux__)
  for (const auto& p : paths) {
    char resolved[PATH_MAX];
    if (::realpath(p.c_str(), resolved)) files_.emplace_back(resolved);
  }
#else
  (void)paths;
#endif
}

size_t FilePages::release() const {
  size_t advised = 0;
#if defined(__linux__)
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (!maps) return 0;
  char line[PATH_MAX + 128];
  while (std::fgets(line, sizeof line, maps)) {
    unsigned long start = 0, end = 0;
    char perms[8] = {0};
    int path_at = 0;
    if (std::sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &start, &end, perms, &path_at) < 3 || path_at == 0) continue;
    if (perms[1] == 'w') continue;  // only mappings nothing can write: their pages are the file's bytes
    std::string path(line + path_at);
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    for (const auto& f : files_)
      if (path == f && ::madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED) == 0)
        advised += end - start;
  }
  std::fclose(maps);
#endif
  return advised;
}

}  // namespace far
