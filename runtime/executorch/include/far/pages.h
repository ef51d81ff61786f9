// Give back the resident pages of read-only file mappings (the programs, the examples) between steps.
//
// Both programs and the examples file are mapped read-only. What a step reads of them -- the word-embedding
// rows of its batch, the frozen weights XNNPACK has already packed into its own buffers, the batch's
// examples -- stays resident after the step and counts in the process's RSS, and over an epoch that grows
// towards the whole files (the embedding table alone is 47 MB for MiniLM). Dropping those pages after each
// step keeps only what one step touches: the next read faults the page back in from the page cache (or the
// file), with the same bytes, since nothing ever writes these mappings. Linux only; elsewhere a no-op.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace far {

class FilePages {
 public:
  explicit FilePages(const std::vector<std::string>& paths);
  // madvise(MADV_DONTNEED) every read-only mapping of the files; returns the bytes of address space advised.
  size_t release() const;

 private:
  std::vector<std::string> files_;  // resolved paths, as /proc/self/maps names them
};

}  // namespace far
