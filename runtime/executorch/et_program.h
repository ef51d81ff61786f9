// One ExecuTorch program and its "forward" method, loaded with the plain runtime API (Program/Method), which
// is what the executorch wheel ships as a C++ library (there is no C++ TrainingModule in it).
//
// The joint (forward + backward) program's trainable parameters are mutable, memory-planned tensors: their
// initial values are copied into the planned buffers when the method loads, and "forward" returns them as
// outputs that alias those buffers. So they are reachable, and writable, right after load_method and before
// any execution: the runner copies the state into them there (and checks after the first step that the
// outputs still point at the same memory).
#pragma once

#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

// libexecutorch_threadpool.so exports these, but the wheel ships no threadpool.h (only threadpool_guard.h).
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t num_threads);
  size_t get_thread_count() const;
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

namespace far_et {

namespace et = executorch::runtime;

inline std::string error_name(et::Error e) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", static_cast<unsigned>(e));
  return buf;
}

class LoadedProgram {
 public:
  // The file is mapped read-only: the program never writes its constants (the trainable tensors live in planned
  // memory), so the OS can share and evict the frozen weights, and only the pages touched become resident.
  explicit LoadedProgram(const std::string& path) : path_(path) {
    auto l = executorch::extension::MmapDataLoader::from(path.c_str(),
                                                         executorch::extension::MmapDataLoader::MlockConfig::NoMlock);
    if (!l.ok()) fail("cannot map", l.error());
    loader_ = std::make_unique<executorch::extension::MmapDataLoader>(std::move(l.get()));
    auto p = et::Program::load(loader_.get());
    if (!p.ok()) fail("not a loadable ExecuTorch program", p.error());
    program_.emplace(std::move(p.get()));
  }

  bool has_method(const char* name) const {
    for (size_t i = 0; i < program_->num_methods(); ++i) {
      auto n = program_->get_method_name(i);
      if (n.ok() && std::string(n.get()) == name) return true;
    }
    return false;
  }

  // Run a metadata method (no inputs, not planned) and return its outputs.
  template <typename F>
  void run_meta(const char* name, F&& use_outputs) {
    executorch::extension::MallocMemoryAllocator method_alloc, temp_alloc;
    et::MemoryManager mm(&method_alloc, nullptr, &temp_alloc);
    auto m = program_->load_method(name, &mm);
    if (!m.ok()) fail(std::string("cannot load method ") + name, m.error());
    et::Error e = m->execute();
    if (e != et::Error::Ok) fail(std::string("cannot run method ") + name, e);
    use_outputs(*m);
  }

  int64_t meta_int(const char* name) {
    int64_t v = 0;
    run_meta(name, [&](et::Method& m) { v = m.get_output(0).toInt(); });
    return v;
  }

  // Load "forward" with its planned buffers allocated up front.
  et::Method& load_forward() {
    auto meta = program_->method_meta("forward");
    if (!meta.ok()) fail("has no method \"forward\"", meta.error());
    for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
      const size_t n = static_cast<size_t>(meta->memory_planned_buffer_size(i).get());
      planned_.emplace_back(new uint8_t[n]);  // not zeroed: pages become resident only when the program uses them
      spans_.emplace_back(planned_.back().get(), n);
      planned_bytes_ += n;
    }
    planned_alloc_ = std::make_unique<et::HierarchicalAllocator>(et::Span<et::Span<uint8_t>>(spans_.data(), spans_.size()));
    memory_ = std::make_unique<et::MemoryManager>(&method_alloc_, planned_alloc_.get(), &temp_alloc_);
    auto m = program_->load_method("forward", memory_.get());
    if (!m.ok()) fail("cannot load method \"forward\"", m.error());
    method_.emplace(std::move(m.get()));
    return *method_;
  }

  et::MethodMeta forward_meta() const { return program_->method_meta("forward").get(); }
  et::Method& forward() { return *method_; }
  size_t planned_bytes() const { return planned_bytes_; }

  // Whether [p, p + n) lies inside one of the planned buffers (memory this process owns and may write).
  bool in_planned(const void* p, size_t n) const {
    auto c = static_cast<const uint8_t*>(p);
    for (const auto& s : spans_)
      if (c >= s.data() && c + n <= s.data() + s.size()) return true;
    return false;
  }
  const std::string& path() const { return path_; }

  void execute() {
    et::Error e = method_->execute();
    if (e != et::Error::Ok) fail("\"forward\" failed", e);
  }

  [[noreturn]] void fail(const std::string& what, et::Error e) const {
    throw std::runtime_error(path_ + ": " + what + " (ExecuTorch error " + error_name(e) + ")");
  }

 private:
  std::string path_;
  std::unique_ptr<et::DataLoader> loader_;
  std::optional<et::Program> program_;
  std::vector<std::unique_ptr<uint8_t[]>> planned_;
  std::vector<et::Span<uint8_t>> spans_;
  size_t planned_bytes_ = 0;
  std::unique_ptr<et::HierarchicalAllocator> planned_alloc_;
  executorch::extension::MallocMemoryAllocator method_alloc_, temp_alloc_;
  std::unique_ptr<et::MemoryManager> memory_;
  std::optional<et::Method> method_;
};

}  // namespace far_et
