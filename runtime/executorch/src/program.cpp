#include "far/program.h"

#include "far/kernels.h"

#include <cstdio>
#include <stdexcept>

// libexecutorch_threadpool.so exports these, but the wheel ships no threadpool.h (only threadpool_guard.h):
// declared here, in the one file that calls them, as the library defines them.
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

namespace far {

namespace et = executorch::runtime;
using executorch::extension::MallocMemoryAllocator;
using executorch::extension::MmapDataLoader;

std::string error_name(et::Error e) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", static_cast<unsigned>(e));
  return buf;
}

void set_threads(uint32_t threads) {
  executorch::extension::threadpool::get_threadpool()->_unsafe_reset_threadpool(threads);
}

Program::Program(const std::string& path) : path_(path) {
  auto l = MmapDataLoader::from(path.c_str(), MmapDataLoader::MlockConfig::NoMlock);
  if (!l.ok()) fail("cannot map", l.error());
  loader_ = std::make_unique<MmapDataLoader>(std::move(l.get()));
  auto p = et::Program::load(loader_.get());
  if (!p.ok()) fail("not a loadable ExecuTorch program", p.error());
  program_.emplace(std::move(p.get()));
}

bool Program::has_method(const char* name) const {
  for (size_t i = 0; i < program_->num_methods(); ++i) {
    auto n = program_->get_method_name(i);
    if (n.ok() && std::string(n.get()) == name) return true;
  }
  return false;
}

void Program::run_meta(const char* name, const std::function<void(et::Method&)>& use_outputs) {
  MallocMemoryAllocator method_alloc, temp_alloc;
  et::MemoryManager mm(&method_alloc, nullptr, &temp_alloc);
  auto m = program_->load_method(name, &mm);
  if (!m.ok()) fail(std::string("cannot load method ") + name, m.error());
  const et::Error e = m->execute();
  if (e != et::Error::Ok) fail(std::string("cannot run method ") + name, e);
  use_outputs(*m);
}

int64_t Program::meta_int(const char* name) {
  int64_t v = 0;
  run_meta(name, [&](et::Method& m) { v = m.get_output(0).toInt(); });
  return v;
}

et::Method& Program::load_forward() {
  auto meta = program_->method_meta("forward");
  if (!meta.ok()) fail("has no method \"forward\"", meta.error());
  for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
    const size_t n = static_cast<size_t>(meta->memory_planned_buffer_size(i).get());
    planned_.emplace_back(new uint8_t[n]);
    spans_.emplace_back(planned_.back().get(), n);
    planned_bytes_ += n;
  }
  planned_alloc_ = std::make_unique<et::HierarchicalAllocator>(et::Span<et::Span<uint8_t>>(spans_.data(), spans_.size()));
  memory_ = std::make_unique<et::MemoryManager>(&method_alloc_, planned_alloc_.get(), &temp_alloc_);
  auto m = program_->load_method("forward", memory_.get(), nullptr, nullptr, nullptr, step_kernels());
  if (!m.ok()) fail("cannot load method \"forward\"", m.error());
  method_.emplace(std::move(m.get()));
  return *method_;
}

et::MethodMeta Program::forward_meta() const { return program_->method_meta("forward").get(); }

void Program::execute() {
  const et::Error e = method_->execute();
  if (e != et::Error::Ok) fail("\"forward\" failed", e);
}

void Program::execute_in_steps(size_t every, const std::function<void()>& between) {
  for (size_t done = 1;; ++done) {
    const et::Error e = method_->step();
    if (e == et::Error::EndOfMethod) break;
    if (e != et::Error::Ok) fail("\"forward\" failed", e);
    if (done % every == 0) between();
  }
  const et::Error e = method_->reset_execution();
  if (e != et::Error::Ok) fail("\"forward\" could not start again", e);
}

bool Program::in_planned(const void* p, size_t n) const {
  auto c = static_cast<const uint8_t*>(p);
  for (const auto& s : spans_)
    if (c >= s.data() && c + n <= s.data() + s.size()) return true;
  return false;
}

void Program::fail(const std::string& what, et::Error e) const {
  throw std::runtime_error(path_ + ": " + what + " (ExecuTorch error " + error_name(e) + ")");
}

}  // namespace far
