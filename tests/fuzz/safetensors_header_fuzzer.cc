// The safetensors header parser and validation (runtime/model/safetensors.h):
// the input is a whole .safetensors file (8-byte little-endian header length,
// JSON header, data), written to a temporary file and opened as the loader
// opens a checkpoint; every tensor of a file that opens is read back.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/model/safetensors.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string* const path = [] {
    const char* dir = std::getenv("TEST_TMPDIR");
    std::string p = std::string(dir != nullptr ? dir : "/tmp") +
                    "/fuzz_safetensors_" + std::to_string(getpid()) +
                    ".safetensors";
    return new std::string(std::move(p));
  }();
  FILE* f = std::fopen(path->c_str(), "wb");
  if (f == nullptr) __builtin_trap();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  auto checkpoint = tessera::Checkpoint::OpenFile(*path);
  if (checkpoint.ok()) {
    for (const std::string& name : (*checkpoint)->Names()) {
      auto info = (*checkpoint)->Get(name);
      if (info.ok()) (void)(*checkpoint)->LoadF32(name, info->shape);
    }
  }
  return 0;
}
