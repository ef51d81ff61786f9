#include "far/chunks.h"

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include "far/disk.h"

namespace far {

std::unique_ptr<Chunks> read_chunks(const std::string& path, int64_t max_length, int64_t vocab_size,
                                    const std::string& base_fingerprint) {
  return read_chunks(std::make_shared<safetensors::Mapping>(path), path, max_length, vocab_size, base_fingerprint);
}

std::unique_ptr<Chunks> read_chunks(std::shared_ptr<safetensors::Mapping> bytes, const std::string& path,
                                    int64_t max_length, int64_t vocab_size, const std::string& base_fingerprint) {
  auto c = std::make_unique<Chunks>();
  c->file = safetensors::parse(std::move(bytes), path);
  const safetensors::File& f = c->file;
  auto fail = [&](const std::string& what) { return std::runtime_error(path + ": " + what); };
  const std::string rewrite = "; write it for this export (far export --model NAME --train-file TEXTS writes "
                              "OUT/text.safetensors)";
  if (f.meta("format") != "far.device.chunks")
    throw fail("not a chunks file (format '" + f.meta("format") + "', expected far.device.chunks)" + rewrite);
  if (f.meta("format_version") != "1")
    throw fail("chunks format version '" + f.meta("format_version") + "'; far_train reads version 1" + rewrite);
  if (f.meta("base_fingerprint") != base_fingerprint) throw fail("written for another base model" + rewrite);
  if (f.meta("max_length") != std::to_string(max_length))
    throw fail("chunks of " + f.meta("max_length") + " tokens; the program takes " + std::to_string(max_length) +
               rewrite);
  c->length = max_length;
  for (const char* name : {"train", "held_out"}) {
    const safetensors::Tensor* t = f.find(name);
    if (!t) throw fail(std::string("lacks '") + name + "'" + rewrite);
    if (t->dtype != "I32") throw fail(std::string("'") + name + "' is " + t->dtype + ", not int32 (I32)" + rewrite);
    if (t->shape.size() != 2 || t->shape[1] != max_length)
      throw fail(std::string("'") + name + "' has shape " + safetensors::shape_str(t->shape) + ", not [N, " +
                 std::to_string(max_length) + "]" + rewrite);
    for (int64_t i = 0; i < t->numel(); ++i) {
      const int32_t id = t->at<int32_t>(i);
      if (id < 0 || id >= vocab_size)
        throw fail(std::string("'") + name + "' chunk " + std::to_string(i / max_length) + " holds token id " +
                   std::to_string(id) + ", outside the model's vocabulary (0-" + std::to_string(vocab_size - 1) + ")" +
                   rewrite);
    }
    (std::string(name) == "train" ? c->train : c->held_out) = t;
  }
  c->n_train = c->train->shape[0];
  c->n_held_out = c->held_out->shape[0];
  return c;
}

BottomCache::BottomCache(const std::string& path, const std::map<std::string, std::string>& key, int64_t rows,
                         int64_t length, int64_t hidden, int64_t batch, const Compute& compute)
    : path_(path), length_(length), hidden_(hidden) {
  const std::vector<int64_t> shape = {rows, length, hidden};
  if (!matches(key, shape)) {
    build(key, shape, batch, compute);
    built_ = true;
    if (!matches(key, shape)) throw std::runtime_error(path + ": the bottom cache just written does not read back");
  }
}

// Whether `path_` holds the output for `key` of `shape`; if so it stays mapped.
bool BottomCache::matches(const std::map<std::string, std::string>& key, const std::vector<int64_t>& shape) {
  try {
    file_ = safetensors::read(path_);
  } catch (const std::exception&) {  // absent, or a damaged file: built again
    return false;
  }
  for (const auto& [k, v] : key)
    if (file_.meta(k) != v) return false;
  const safetensors::Tensor* t = file_.find("hidden");
  if (file_.meta("format") != "far.device.bottom_cache" || !t || t->dtype != "F32" || t->shape != shape) return false;
  data_ = reinterpret_cast<const float*>(t->data);  // the data starts 8-byte aligned (the header is padded)
  return true;
}

void BottomCache::build(const std::map<std::string, std::string>& key, const std::vector<int64_t>& shape,
                        int64_t batch, const Compute& compute) {
  file_ = safetensors::File();
  std::map<std::string, std::string> metadata = key;
  metadata["format"] = "far.device.bottom_cache";
  const int64_t rows = shape[0], per_row = shape[1] * shape[2];
  std::vector<float> out(static_cast<size_t>(batch * per_row));
  safetensors::write_atomic_streamed(path_, {{"hidden", "F32", shape, nullptr}}, metadata, [&](AtomicFile& file) {
    for (int64_t first = 0; first < rows; first += batch) {
      compute(first, out.data());
      const int64_t n = std::min(batch, rows - first);
      file.put(out.data(), static_cast<size_t>(n * per_row) * sizeof(float));
    }
  });
}

}  // namespace far
