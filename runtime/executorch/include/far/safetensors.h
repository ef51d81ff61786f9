// A safetensors reader and atomic writer (https://github.com/huggingface/safetensors#format).
//
// Layout: 8 bytes little-endian u64 N, then N bytes of JSON header, then the data. The header is an object
// of name -> {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data, which the tensors
// cover exactly, without holes), plus an optional "__metadata__" object of string -> string.
// The reader maps the file (its pages stay evictable: a large examples file costs little resident memory),
// checks all of that and throws FormatError naming the file: a truncated or corrupt file is refused whole,
// never half-used. Tensors point into the mapping, which lives as long as the File (or a copy of it).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace far {
class AtomicFile;  // far/disk.h
}  // namespace far

namespace far::safetensors {

struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bytes per element of a safetensors dtype ("F32", "I64", ...); 0 for a dtype this reader does not know.
size_t dtype_size(const std::string& dtype);
// torch's name of a safetensors dtype ("F32" -> "float32"); the name itself when unknown.
std::string torch_dtype(const std::string& dtype);
// The number of elements of `shape` (1 for a scalar); no overflow check (see read()).
int64_t numel(const std::vector<int64_t>& shape);
std::string shape_str(const std::vector<int64_t>& shape);

// A tensor read from a file: its bytes (little-endian, C order) inside the file's mapping.
struct Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const { return safetensors::numel(shape); }
  // Element i as T (memcpy: the data need not be aligned for T).
  template <typename T>
  T at(int64_t i) const {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    return v;
  }
};

// A read-only mapping of a whole file, or a copy of bytes held in memory (what the readers' fuzz test feeds
// them: on the heap, AddressSanitizer sees a read one byte past the end, which a page-rounded mapping hides).
class Mapping {
 public:
  explicit Mapping(const std::string& path);
  // A copy of `bytes`, sized exactly.
  static std::shared_ptr<Mapping> copy_of(const std::string& bytes);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  const uint8_t* data() const { return addr_; }
  size_t size() const { return size_; }

 private:
  Mapping() = default;
  const uint8_t* addr_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
};

// A tensor to write: borrows its bytes.
struct TensorView {
  std::string name, dtype;
  std::vector<int64_t> shape;
  const void* data;
};

struct File {
  std::shared_ptr<Mapping> mapping;             // what the tensors point into
  std::vector<Tensor> tensors;                  // in header order
  std::map<std::string, std::string> metadata;  // "__metadata__"

  const Tensor* find(const std::string& name) const;
  // metadata[key], or `fallback` when absent.
  std::string meta(const std::string& key, const std::string& fallback = "") const;
};

// Map and check `path`; FormatError names the file and what is wrong.
File read(const std::string& path);
// Check the bytes `bytes` holds, read from `path` (named in errors), and keep them for the tensors.
// Nothing is allocated from a number in the header: every size is bounded by the bytes there are.
File parse(std::shared_ptr<Mapping> bytes, const std::string& path);

// The JSON header write_atomic writes for `tensors` and `metadata`, padded with spaces to a multiple of 8 bytes.
std::string header_text(const std::vector<TensorView>& tensors, const std::map<std::string, std::string>& metadata);

// Write `tensors` and `metadata` to `path` atomically: `path`.tmp is written, fsynced and renamed onto `path`
// (then the folder is fsynced), so `path` always holds either the previous file or the new one, whole.
// far::WriteError (far/disk.h) when it cannot: a full disk is found before writing where the filesystem says
// how much room it has, else at the write that fails; the message names the disk and the bytes needed, and
// `path` keeps its previous version with no .tmp left beside it.
void write_atomic(const std::string& path, const std::vector<TensorView>& tensors,
                  const std::map<std::string, std::string>& metadata);
// The same for tensors too large to hold in memory at once: their `data` is not read; `put_data` must put
// exactly their bytes, in order, into the file (AtomicFile::put), e.g. one row group at a time.
void write_atomic_streamed(const std::string& path, const std::vector<TensorView>& tensors,
                           const std::map<std::string, std::string>& metadata,
                           const std::function<void(AtomicFile&)>& put_data);

}  // namespace far::safetensors
