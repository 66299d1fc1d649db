// The OpenAI request parser (runtime/serve/openai_protocol.h): any body on
// any endpoint (completions, chat, tokenize, detokenize) gives a request or
// an API error.
#include "absl/strings/string_view.h"
#include "runtime/serve/openai_protocol.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  (void)tessera::serve::ParseCompletionRequest(body);
  (void)tessera::serve::ParseChatRequest(body);
  (void)tessera::serve::ParseTokenizeRequest(body);
  (void)tessera::serve::ParseDetokenizeRequest(body, 32000);
  return 0;
}
