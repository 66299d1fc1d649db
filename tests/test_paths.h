// Where tests find their data under Bazel (runfiles) — one place for the layout.
#ifndef TESSERA_TESTS_TEST_PATHS_H_
#define TESSERA_TESTS_TEST_PATHS_H_

#include <cstdlib>
#include <string>

namespace tessera {

inline std::string RunfilesRoot() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return srcdir != nullptr ? srcdir : ".";
}

// tests/fixtures of this repository.
inline std::string FixturesDir() { return RunfilesRoot() + "/tessera/tests/fixtures"; }

// One folder per architecture: config.json, model.safetensors, golden.json.
inline std::string GoldenDir() { return FixturesDir() + "/golden"; }

// ../shared/models/stories260K (the @shared repository).
inline std::string DemoModelDir() { return RunfilesRoot() + "/shared/models/stories260K"; }

}  // namespace tessera

#endif  // TESSERA_TESTS_TEST_PATHS_H_
