// The Jinja renderer (runtime/text/jinja.h) through ChatTemplate: any bytes
// as a template source, rendered over a fixed conversation, give text or an
// error (bounded output and recursion: jinja.h's limits).
#include <string>

#include "nlohmann/json.hpp"
#include "runtime/text/chat_template.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json* const messages =
      new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi <b>there</b> \u00e9"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": [{"type": "text", "text": "and?"}]}])"));
  auto t = tessera::ChatTemplate::FromString(
      std::string(reinterpret_cast<const char*>(data), size),
      {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  if (!t.ok()) return 0;
  (void)t->Render(*messages, /*add_generation_prompt=*/true);
  (void)t->Render(*messages, /*add_generation_prompt=*/false,
                  nlohmann::ordered_json{{"enable_thinking", false}});
  return 0;
}
