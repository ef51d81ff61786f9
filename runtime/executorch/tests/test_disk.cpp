// A state written to a disk that is full: far::write_state stops with a far::WriteError naming the disk and
// the bytes it needed, the previous state stays byte for byte, and no .tmp is left beside it.
//
//   test_disk DATA_DIR                 the write that fails midway: STATE.tmp is a link to /dev/full (every
//                                      write to it fails with ENOSPC), the room the filesystem reports is ample
//   test_disk --write PATH FLOATS      write a state of FLOATS float32 values to PATH as far_train does, and
//                                      fail as far_train does ("far_train: error: ...", exit status 1):
//                                      tests/test_device_fuzz.py runs it on a 64 KiB tmpfs
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "check.h"
#include "far/disk.h"
#include "far/json.h"
#include "far/manifest.h"
#include "far/state.h"

namespace {

far::Manifest manifest(int64_t n) {
  const far::Json m = {{"format", "far.device"}, {"format_version", 2}, {"batch_size", 4}, {"micro_batch_size", 4},
                       {"accumulate", 1}, {"max_length", 8}, {"base_fingerprint", "base-1"},
                       {"trainable", {{{"name", "w"}, {"shape", {n}}, {"dtype", "float32"}}}},
                       {"programs", {{"train", {{"file", "train.pte"}, {"sha256", "abc"}}}}},
                       {"optimizer", {{"name", "sgd"}, {"lr", 0.1}}}};
  return far::parse_manifest(m.dump(), "OUT");
}

void write(const std::string& path, int64_t n, float value) {
  std::vector<float> w(static_cast<size_t>(n), value);
  far::write_state(path, manifest(n), {{"w", "F32", {n}, w.data()}}, {3, 0, 3, 7, "feed"});
}

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// Every write to /dev/full fails with ENOSPC: the path a write takes when the disk fills up midway.
void full_midway(const std::string& dir) {
  const std::string path = dir + "/state.safetensors", tmp = path + ".tmp";
  write(path, 16, 1.f);
  const std::string before = bytes_of(path);
  CHECK(::symlink("/dev/full", tmp.c_str()) == 0);
  CHECK_THROWS(far::WriteError, write(path, 4096, 2.f), "keeps its previous version, unchanged");
  CHECK(bytes_of(path) == before);
  CHECK(!exists(tmp));
  // The message names the disk and the bytes: the whole file, header and data.
  CHECK(::symlink("/dev/full", tmp.c_str()) == 0);
  try {
    write(path, 4096, 2.f);
    CHECK(false);
  } catch (const far::WriteError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("no space left on the disk mounted at /") != std::string::npos);
    CHECK(msg.find("to write " + path + ": it needs ") != std::string::npos);
    const size_t at = msg.find("it needs ") + 9;
    const long long needed = std::atoll(msg.c_str() + at);
    CHECK(needed > 4096 * 4 && needed < 4096 * 4 + 1024);
  }
  CHECK(bytes_of(path) == before && !exists(tmp));
  // No previous version: nothing is left under the name either.
  const std::string fresh = dir + "/fresh.safetensors";
  CHECK(::symlink("/dev/full", (fresh + ".tmp").c_str()) == 0);
  CHECK_THROWS(far::WriteError, write(fresh, 64, 1.f), fresh + " was not written");
  CHECK(!exists(fresh) && !exists(fresh + ".tmp"));
  // And the next write, with room, goes through.
  write(path, 64, 3.f);
  CHECK(far::read_state(path, manifest(64)).step == 3);
  std::remove(path.c_str());
}

void names_the_disk() {
  CHECK(far::describe_disk("/").find("the disk mounted at /") == 0);
  CHECK(far::folder_of("a.safetensors") == "." && far::folder_of("/a") == "/" && far::folder_of("x/y/z") == "x/y");
  CHECK(far::free_bytes("/") != UINT64_MAX);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--write") {
    try {
      write(argv[2], std::atoll(argv[3]), 1.f);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "far_train: error: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  char tmpl[] = "/tmp/far_test_disk_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  names_the_disk();
  full_midway(dir);
  ::rmdir(dir.c_str());
  return far::test::finish("disk");
}
