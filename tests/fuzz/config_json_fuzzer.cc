// config.json and generation_config.json parsing (runtime/model/config.h):
// any bytes give a config or an error.
#include <string>

#include "absl/strings/string_view.h"
#include "runtime/model/config.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = tessera::ParseModelConfig(text);
  if (config.ok()) {
    // The same bytes as a generation_config.json over the parsed config.
    (void)tessera::MergeGenerationConfig(text, &*config);
    (void)tessera::LimitContext(config->max_position_embeddings / 2 + 1,
                                &*config);
  }
  return 0;
}
