// Give back the resident pages of read-only file mappings (the programs, the examples) between steps.
//
// Both programs and the examples file are mapped read-only. What a step reads of them -- the word-embedding
// rows of its batch, the frozen weights XNNPACK has already packed into its own buffers, the batch's
// examples -- stays resident after the step and counts in the process's RSS, and over an epoch that grows
// towards the whole files (the embedding table alone is 47 MB for MiniLM). Dropping those pages after each
// step keeps only what one step touches: the next read faults the page back in from the page cache (or the
// file), with the same bytes, since nothing ever writes these mappings. Linux only; elsewhere a no-op.
#pragma once

#include <string>
#include <vector>

#if defined(__linux__)
#include <cstdio>
#include <cstdlib>
#include <limits.h>
#include <sys/mman.h>
#endif

namespace far_pages {

class FilePages {
 public:
  explicit FilePages(const std::vector<std::string>& paths) {
#if defined(__linux__)
    for (const auto& p : paths) {
      char resolved[PATH_MAX];
      if (::realpath(p.c_str(), resolved)) files_.emplace_back(resolved);
    }
#else
    (void)paths;
#endif
  }

  // madvise(MADV_DONTNEED) every read-only mapping of the files; returns the bytes of address space advised.
  size_t release() const {
    size_t advised = 0;
#if defined(__linux__)
    FILE* maps = std::fopen("/proc/self/maps", "r");
    if (!maps) return 0;
    char line[PATH_MAX + 128];
    while (std::fgets(line, sizeof line, maps)) {
      unsigned long start = 0, end = 0;
      char perms[8] = {0};
      int path_at = 0;
      if (std::sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &start, &end, perms, &path_at) < 3 || path_at == 0)
        continue;
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

 private:
  std::vector<std::string> files_;
};

}  // namespace far_pages
