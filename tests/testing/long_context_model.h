// The demo checkpoint (tests/test_paths.h DemoModelDir) under a longer
// context: a folder in the test's temporary directory with its config.json,
// max_position_embeddings set to `context`, and a link to its weights (its
// RoPE does not depend on the context). For tests that grow a sequence past
// the demo's 512 positions.
#ifndef TESSERA_TESTS_TESTING_LONG_CONTEXT_MODEL_H_
#define TESSERA_TESTS_TESTING_LONG_CONTEXT_MODEL_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_paths.h"

namespace tessera {

// `name` is the folder's name under the temporary directory.
inline std::string LongContextDemoModel(const std::string& name,
                                        int64_t context) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::create_directories(dir);
  std::ifstream in(DemoModelDir() + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in, nullptr, false);
  EXPECT_FALSE(config.is_discarded());
  config["max_position_embeddings"] = context;
  std::ofstream(dir / "config.json") << config.dump();
  const fs::path weights = dir / "model.safetensors";
  if (!fs::exists(weights)) {
    fs::create_symlink(fs::absolute(DemoModelDir() + "/model.safetensors"),
                       weights);
  }
  return dir.string();
}

}  // namespace tessera

#endif  // TESSERA_TESTS_TESTING_LONG_CONTEXT_MODEL_H_
