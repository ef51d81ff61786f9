// A minimal safetensors reader and atomic writer (https://github.com/huggingface/safetensors#format).
//
// Layout: 8 bytes little-endian u64 N, then N bytes of JSON header, then the data. The header is an object
// of name -> {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data, which the tensors
// cover exactly, without holes), plus an optional "__metadata__" object of string -> string.
// The reader maps the file (its pages stay evictable: a large examples file costs little resident memory),
// checks all of that and throws FormatError naming the file: a truncated or corrupt file is refused whole,
// never half-used. Tensors point into the mapping, which lives as long as the File (or a copy of it).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.h"

namespace far_st {

struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

inline int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A tensor read from a file: its bytes (little-endian, C order) inside the file's mapping.
struct Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const { return far_st::numel(shape); }
  // Element i as T (memcpy: the data need not be aligned for T).
  template <typename T>
  T at(int64_t i) const {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    return v;
  }
};

// A read-only mapping of a whole file.
class Mapping {
 public:
  explicit Mapping(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw FormatError(path + ": cannot open: " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) { ::close(fd); throw FormatError(path + ": cannot stat: " + std::strerror(errno)); }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) { ::close(fd); throw FormatError(path + ": cannot map: " + std::strerror(errno)); }
      addr_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
  }
  ~Mapping() { if (addr_) ::munmap(const_cast<uint8_t*>(addr_), size_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  const uint8_t* data() const { return addr_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* addr_ = nullptr;
  size_t size_ = 0;
};

// A tensor to write: borrows its bytes.
struct TensorView {
  std::string name, dtype;
  std::vector<int64_t> shape;
  const void* data;
};

struct File {
  std::shared_ptr<Mapping> mapping;              // what the tensors point into
  std::vector<Tensor> tensors;                   // in header order
  std::map<std::string, std::string> metadata;  // "__metadata__"

  const Tensor* find(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  // metadata[key], or `fallback` when absent.
  std::string meta(const std::string& key, const std::string& fallback = "") const {
    auto it = metadata.find(key);
    return it == metadata.end() ? fallback : it->second;
  }
};

inline File read(const std::string& path) {
  auto fail = [&](const std::string& what) -> FormatError { return FormatError(path + ": " + what); };
  auto mapping = std::make_shared<Mapping>(path);
  const uint8_t* bytes = mapping->data();
  const uint64_t size = mapping->size();
  if (size < 8) throw fail("truncated: " + std::to_string(size) + " bytes, not even a header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > size - 8)
    throw fail("truncated or not a safetensors file: the header claims " + std::to_string(header_len) +
               " bytes, the file has " + std::to_string(size - 8) + " after the length");
  far_json::Value header;
  try {
    header = far_json::parse(std::string(reinterpret_cast<const char*>(bytes) + 8, header_len));
  } catch (const std::exception& e) {
    throw fail(std::string("corrupt header: ") + e.what());
  }
  if (!header.is_object()) throw fail("corrupt header: not a JSON object");
  const uint64_t data_begin = 8 + header_len, data_len = size - data_begin;

  File out;
  out.mapping = mapping;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& kv : header.object) {
    const std::string& name = kv.first;
    const far_json::Value& v = kv.second;
    if (name == "__metadata__") {
      if (!v.is_object()) throw fail("corrupt header: __metadata__ is not an object");
      for (const auto& m : v.object) {
        if (!m.second.is_string()) throw fail("corrupt header: metadata '" + m.first + "' is not a string");
        out.metadata[m.first] = m.second.string;
      }
      continue;
    }
    const far_json::Value *dtype = v.find("dtype"), *shape = v.find("shape"), *offsets = v.find("data_offsets");
    if (!v.is_object() || !dtype || !dtype->is_string() || !shape || !shape->is_array() || !offsets ||
        !offsets->is_array() || offsets->array.size() != 2)
      throw fail("corrupt header: entry '" + name + "' needs dtype, shape and data_offsets [begin, end]");
    Tensor t;
    t.name = name;
    t.dtype = dtype->string;
    const size_t esize = dtype_size(t.dtype);
    if (!esize) throw fail("tensor '" + name + "' has unknown dtype " + t.dtype);
    for (const auto& d : shape->array) {
      if (!d.is_integer || d.integer < 0) throw fail("corrupt header: bad shape of '" + name + "'");
      t.shape.push_back(d.integer);
    }
    const far_json::Value &b = offsets->array[0], &e = offsets->array[1];
    if (!b.is_integer || !e.is_integer || b.integer < 0 || e.integer < b.integer)
      throw fail("corrupt header: bad data_offsets of '" + name + "'");
    if (static_cast<uint64_t>(e.integer) > data_len)
      throw fail("truncated: tensor '" + name + "' ends at byte " + std::to_string(e.integer) + " of the data, which has " +
                 std::to_string(data_len));
    if (static_cast<uint64_t>(e.integer - b.integer) != static_cast<uint64_t>(t.numel()) * esize)
      throw fail("corrupt: tensor '" + name + "' has " + std::to_string(e.integer - b.integer) + " bytes for shape " +
                 shape_str(t.shape) + " of " + t.dtype);
    t.data = bytes + data_begin + b.integer;
    t.nbytes = static_cast<size_t>(e.integer - b.integer);
    spans.emplace_back(b.integer, e.integer);
    out.tensors.push_back(std::move(t));
  }
  // The data must be covered exactly: no overlaps, no holes, nothing after the last tensor.
  std::sort(spans.begin(), spans.end());
  uint64_t pos = 0;
  for (const auto& s : spans) {
    if (s.first != pos) throw fail("corrupt: tensor data overlap or leave a hole at byte " + std::to_string(pos));
    pos = s.second;
  }
  if (pos != data_len)
    throw fail("corrupt: " + std::to_string(data_len - pos) + " bytes after the last tensor (wrong length?)");
  return out;
}

// Write `tensors` and `metadata` to `path` atomically: `path`.tmp is written, fsynced and renamed onto `path`
// (then the folder is fsynced), so `path` always holds either the previous file or the new one, whole.
inline void write_atomic(const std::string& path, const std::vector<TensorView>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::string header = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& kv : metadata) {
    header += (first ? "" : ",") + far_json::quote(kv.first) + ":" + far_json::quote(kv.second);
    first = false;
  }
  header += "}";
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t nbytes = static_cast<uint64_t>(numel(t.shape)) * dtype_size(t.dtype);
    header += "," + far_json::quote(t.name) + ":{\"dtype\":" + far_json::quote(t.dtype) + ",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) header += (i ? "," : "") + std::to_string(t.shape[i]);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + nbytes) + "]}";
    offset += nbytes;
  }
  header += "}";
  while (header.size() % 8) header += ' ';  // keep the data 8-byte aligned, as the reference writer does

  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& what) { return std::runtime_error(tmp + ": " + what + ": " + std::strerror(errno)); };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw fail("cannot create");
  auto put = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n) {
      ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) { ::close(fd); throw fail("write failed"); }
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  put(len, 8);
  put(header.data(), header.size());
  for (const auto& t : tensors) put(t.data, static_cast<size_t>(numel(t.shape)) * dtype_size(t.dtype));
  if (::fsync(fd) != 0) { ::close(fd); throw fail("fsync failed"); }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw fail("rename failed");
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  if (dir.empty()) dir = "/";
  int dfd = ::open(dir.c_str(), O_RDONLY);
  if (dfd >= 0) { ::fsync(dfd); ::close(dfd); }
}

}  // namespace far_st
