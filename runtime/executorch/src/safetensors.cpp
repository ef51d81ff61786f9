#include "far/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "far/disk.h"
#include "far/json.h"

namespace far::safetensors {

size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string torch_dtype(const std::string& dtype) {
  static const std::map<std::string, std::string> names = {
      {"F64", "float64"}, {"F32", "float32"}, {"F16", "float16"}, {"BF16", "bfloat16"}, {"I64", "int64"},
      {"I32", "int32"},   {"I16", "int16"},   {"I8", "int8"},     {"U8", "uint8"},     {"BOOL", "bool"}};
  auto it = names.find(dtype);
  return it == names.end() ? dtype : it->second;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Mapping::Mapping(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw FormatError(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw FormatError(path + ": cannot stat: " + std::strerror(errno));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw FormatError(path + ": cannot map: " + std::strerror(errno));
    }
    addr_ = static_cast<const uint8_t*>(p);
    mapped_ = true;
  }
  ::close(fd);
}

std::shared_ptr<Mapping> Mapping::copy_of(const std::string& bytes) {
  std::shared_ptr<Mapping> m(new Mapping());
  m->size_ = bytes.size();
  if (!bytes.empty()) {
    auto* copy = new uint8_t[bytes.size()];
    std::memcpy(copy, bytes.data(), bytes.size());
    m->addr_ = copy;
  }
  return m;
}

Mapping::~Mapping() {
  if (addr_ && mapped_) ::munmap(const_cast<uint8_t*>(addr_), size_);
  else delete[] addr_;
}

const Tensor* File::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string File::meta(const std::string& key, const std::string& fallback) const {
  auto it = metadata.find(key);
  return it == metadata.end() ? fallback : it->second;
}

namespace {

// One header entry checked against the data (`data_len` bytes at `data`): its shape's byte count must fit in
// 64 bits and match its offsets, which must lie inside the data. `begin` receives its first byte's offset.
Tensor tensor_entry(const std::string& name, const Json& v, const uint8_t* data, uint64_t data_len,
                    const std::string& path, uint64_t* begin_out) {
  auto fail = [&](const std::string& what) { return FormatError(path + ": " + what); };
  if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
      !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
      v["data_offsets"].size() != 2)
    throw fail("corrupt header: entry '" + name + "' needs dtype, shape and data_offsets [begin, end]");
  Tensor t;
  t.name = name;
  t.dtype = v["dtype"].get<std::string>();
  const size_t esize = dtype_size(t.dtype);
  if (!esize) throw fail("tensor '" + name + "' has unknown dtype " + t.dtype);
  uint64_t count = 1;
  for (const auto& d : v["shape"]) {
    uint64_t dim = 0;
    if (!whole_number(d, &dim) || dim > static_cast<uint64_t>(INT64_MAX))
      throw fail("corrupt header: bad shape of '" + name + "'");
    if (dim != 0 && count > UINT64_MAX / esize / dim)
      throw fail("corrupt header: the shape of '" + name + "' holds more bytes than any file");
    count *= dim;
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t begin = 0, end = 0;
  if (!whole_number(v["data_offsets"][0], &begin) || !whole_number(v["data_offsets"][1], &end) || end < begin)
    throw fail("corrupt header: bad data_offsets of '" + name + "'");
  if (end > data_len)
    throw fail("truncated: tensor '" + name + "' ends at byte " + std::to_string(end) + " of the data, which has " +
               std::to_string(data_len));
  if (end - begin != count * esize)
    throw fail("corrupt: tensor '" + name + "' has " + std::to_string(end - begin) + " bytes for shape " +
               shape_str(t.shape) + " of " + t.dtype);
  t.nbytes = static_cast<size_t>(end - begin);
  t.data = data + begin;
  *begin_out = begin;
  return t;
}

}  // namespace

File read(const std::string& path) { return parse(std::make_shared<Mapping>(path), path); }

File parse(std::shared_ptr<Mapping> mapping, const std::string& path) {
  auto fail = [&](const std::string& what) { return FormatError(path + ": " + what); };
  const uint8_t* bytes = mapping->data();
  const uint64_t size = mapping->size();
  if (size < 8) throw fail("truncated: " + std::to_string(size) + " bytes, not even a header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > size - 8)
    throw fail("truncated or not a safetensors file: the header claims " + std::to_string(header_len) +
               " bytes, the file has " + std::to_string(size - 8) + " after the length");
  Json header;
  try {
    header = parse_json(std::string(reinterpret_cast<const char*>(bytes) + 8, header_len));
  } catch (const std::exception& e) {
    throw fail(std::string("corrupt header: ") + e.what());
  }
  if (!header.is_object()) throw fail("corrupt header: not a JSON object");
  const uint64_t data_begin = 8 + header_len, data_len = size - data_begin;

  File out;
  out.mapping = mapping;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw fail("corrupt header: __metadata__ is not an object");
      for (const auto& [key, value] : v.items()) {
        if (!value.is_string()) throw fail("corrupt header: metadata '" + key + "' is not a string");
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    uint64_t begin = 0;
    Tensor t = tensor_entry(name, v, bytes + data_begin, data_len, path, &begin);
    spans.emplace_back(begin, begin + t.nbytes);
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

std::string header_text(const std::vector<TensorView>& tensors, const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  header["__metadata__"] = Json::object();
  for (const auto& [key, value] : metadata) header["__metadata__"][key] = value;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t nbytes = static_cast<uint64_t>(numel(t.shape)) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';  // keep the data 8-byte aligned, as the reference writer does
  return text;
}

void write_atomic(const std::string& path, const std::vector<TensorView>& tensors,
                  const std::map<std::string, std::string>& metadata) {
  write_atomic_streamed(path, tensors, metadata, [&](AtomicFile& file) {
    for (const auto& t : tensors) file.put(t.data, static_cast<size_t>(numel(t.shape)) * dtype_size(t.dtype));
  });
}

void write_atomic_streamed(const std::string& path, const std::vector<TensorView>& tensors,
                           const std::map<std::string, std::string>& metadata,
                           const std::function<void(AtomicFile&)>& put_data) {
  const std::string text = header_text(tensors, metadata);
  uint64_t data_bytes = 0;
  for (const auto& t : tensors) data_bytes += static_cast<uint64_t>(numel(t.shape)) * dtype_size(t.dtype);
  AtomicFile file(path, 8 + text.size() + data_bytes);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  file.put(len, 8);
  file.put(text.data(), text.size());
  put_data(file);
  file.commit();
}

}  // namespace far::safetensors
