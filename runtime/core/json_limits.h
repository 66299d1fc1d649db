// Limits on JSON from clients and files, checked on the text before a
// document is built.
//
// nlohmann::json parses with its own stack, but copying, comparing, dumping
// and converting a value recurse once per nesting level, so a 40 KB body of
// 20,000 nested arrays overflows the thread's stack wherever the value is
// used. Every JSON that comes from outside is checked here first; every
// recursive walk over it is then bounded by the same depth.
#ifndef TESSERA_RUNTIME_CORE_JSON_LIMITS_H_
#define TESSERA_RUNTIME_CORE_JSON_LIMITS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {

// The deepest nesting of arrays and objects accepted anywhere (a top-level
// object is depth 1). Deep enough for any real request (a tool's JSON schema
// nests a few levels per property), shallow enough for any recursion over it.
inline constexpr int kMaxJsonDepth = 64;

// InvalidArgument ("JSON nested deeper than 64 levels") when `text` has more
// than `max_depth` levels of `[`/`{` outside strings. A linear scan that
// neither allocates nor validates the rest of the syntax (the parser does).
absl::Status CheckJsonNesting(absl::string_view text,
                              int max_depth = kMaxJsonDepth);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_JSON_LIMITS_H_
