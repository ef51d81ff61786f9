// One ExecuTorch program and its "forward" method, loaded with the plain runtime API (Program/Method), which
// is what the executorch wheel ships as a C++ library (there is no C++ TrainingModule in it).
//
// The joint (forward + backward) program's trainable parameters are mutable, memory-planned tensors: their
// initial values are copied into the planned buffers when the method loads, and "forward" returns them as
// outputs that alias those buffers. So they are reachable, and writable, right after load_method and before
// any execution: the runner copies the state into them there (and checks after each step that the
// outputs still point at the same memory).
#pragma once

#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace far {

// ExecuTorch's error code as text ("0x12").
std::string error_name(executorch::runtime::Error e);

// Size ExecuTorch's thread pool (kernels and XNNPACK) to `threads`.
void set_threads(uint32_t threads);

class Program {
 public:
  // The file is mapped read-only: the program never writes its constants (the trainable tensors live in planned
  // memory), so the OS can share and evict the frozen weights, and only the pages touched become resident.
  explicit Program(const std::string& path);

  bool has_method(const char* name) const;
  // Run a metadata method (no inputs, not planned) and hand its outputs to `use_outputs`.
  void run_meta(const char* name, const std::function<void(executorch::runtime::Method&)>& use_outputs);
  // The single int a metadata method returns.
  int64_t meta_int(const char* name);

  // Load "forward" with its planned buffers allocated up front (not zeroed: pages become resident only when the
  // program uses them), its operators resolved to far's kernels where it has them (kernels.h), else the wheel's.
  executorch::runtime::Method& load_forward();
  executorch::runtime::MethodMeta forward_meta() const;
  executorch::runtime::Method& forward() { return *method_; }
  void execute();
  // "forward" one instruction at a time, calling `between` after every `every` of them (the trainer gives back
  // the mapped pages the instructions read, so the frozen weights of a causal LM's program are resident a few
  // layers at a time rather than all at once); the same instructions as execute(), in the same order.
  void execute_in_steps(size_t every, const std::function<void()>& between);

  size_t planned_bytes() const { return planned_bytes_; }
  // Whether [p, p + n) lies inside one of the planned buffers (memory this process owns and may write).
  bool in_planned(const void* p, size_t n) const;
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const std::string& what, executorch::runtime::Error e) const;

  std::string path_;
  std::unique_ptr<executorch::runtime::DataLoader> loader_;
  std::optional<executorch::runtime::Program> program_;
  std::vector<std::unique_ptr<uint8_t[]>> planned_;
  std::vector<executorch::runtime::Span<uint8_t>> spans_;
  size_t planned_bytes_ = 0;
  std::unique_ptr<executorch::runtime::HierarchicalAllocator> planned_alloc_;
  executorch::extension::MallocMemoryAllocator method_alloc_, temp_alloc_;
  std::unique_ptr<executorch::runtime::MemoryManager> memory_;
  std::optional<executorch::runtime::Method> method_;
};

}  // namespace far
