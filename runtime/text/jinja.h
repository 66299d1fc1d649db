// A Jinja2 template engine for chat templates.
//
// Hugging Face chat templates are Jinja2, rendered by transformers in
// jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True, extensions=[loopcontrols]) with `raise_exception` and
// `strftime_now` globals and a `tojson` filter that is json.dumps(...,
// ensure_ascii=False). This engine renders the subset of Jinja that such
// templates use with that environment's exact semantics, so the prompt text
// matches transformers' apply_chat_template byte for byte:
//
//  * Syntax: {{ }}, {% %}, {# #}, whitespace control (-/+ on either side),
//    trim_blocks, lstrip_blocks (rules in jinja_lexer.h), {% raw %}.
//  * Statements: if/elif/else, for (with `if` filter, `else`, loop.index,
//    index0, revindex, revindex0, first, last, length, previtem, nextitem,
//    cycle), break/continue, set (names, tuples, namespace attributes,
//    {% set x %}...{% endset %}), macro (with defaults) and macro calls,
//    transformers' {% generation %}.
//  * Expressions: Python literals, attribute/item access and slices,
//    arithmetic with Python semantics, ~, comparisons (chained), in/not in,
//    and/or/not, conditional expressions, filters and tests, calls.
//  * Values behave as the Python objects they stand for: str(1.0) is "1.0",
//    str(['a']) is "['a']", dicts keep insertion order, a missing attribute is
//    Undefined (prints as "", is false, fails when used in arithmetic).
//  * Filters: abs attr capitalize center count d default dictsort e escape
//    first float forceescape indent int items join last length list lower
//    map max min reject rejectattr replace reverse round safe select
//    selectattr sort string sum title tojson trim unique upper wordcount.
//  * Tests: all of Jinja's (defined, none, string, mapping, iterable, eq, ...).
//  * Methods: str.strip/lstrip/rstrip/split/rsplit/splitlines/startswith/
//    endswith/upper/lower/title/capitalize/casefold/replace/find/rfind/index/
//    rindex/count/join/format/is*/removeprefix/removesuffix/center/ljust/
//    rjust/zfill/partition/rpartition; dict.get/items/keys/values/copy;
//    list.count/index/copy.
//  * Globals: range, namespace, dict, raise_exception, strftime_now.
//
// Anything outside the subset fails with a Status that names it and the line:
// `unsupported filter "wordwrap" (line 12)` (the other Jinja filters,
// {% include %} and friends, {% call %}, recursive loops, "%" formatting).
// Known differences that do not fail: integers are 64-bit (overflow is an
// error, not a big int); case mapping is Unicode's simple mapping plus the
// common special cases (ß, ligatures, İ); objects Python prints with an
// address (generators, functions, the loop object) print differently.
//
// A template's raise_exception("msg") fails with InvalidArgument whose
// message is exactly "msg" (IsTemplateException tells it apart). A runaway
// template (endless recursion, enormous loops, strings, lists or output,
// values nested deeper than 128 levels) and variables nested deeper than
// kMaxJsonDepth stop with InvalidArgument naming the limit: these are
// properties of the request and the template, never a reason to retry (so
// never ResourceExhausted, which a server answers with 429). Rendering needs
// about 1 MB of stack at most. Template is
// immutable after Parse, so one may Render from several threads at once.
#ifndef TESSERA_RUNTIME_TEXT_JINJA_H_
#define TESSERA_RUNTIME_TEXT_JINJA_H_

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace jinja {

struct Stmt;

struct RenderOptions {
  // Guards against runaway templates. A step is one statement or expression
  // evaluated; chat templates take about a hundred per message.
  int64_t max_steps = 10'000'000;
  size_t max_output_bytes = size_t{64} << 20;
  int max_call_depth = 100;  // nested macro calls
  // The clock strftime_now() formats (local time); null: the system clock.
  std::function<std::time_t()> clock;
};

class Template {
 public:
  // Parses `source`. Syntax errors and unknown filters/tests fail here.
  static absl::StatusOr<Template> Parse(absl::string_view source);

  // Renders with `variables`, a JSON object whose members become template
  // variables (JSON null is Python None, objects are dicts in member order).
  // Besides them the template sees Jinja's globals (range, namespace, dict)
  // and transformers' raise_exception and strftime_now.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& variables,
                                     const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
};

// InvalidArgument ("JSON nested deeper than 64 levels") when `json` has more
// than `max_depth` levels of arrays/objects. Iterative (no recursion at
// all), so it is safe on any document however it was built; run it before
// copying a document you did not parse yourself (copies recurse). Render
// refuses variables deeper than kMaxJsonDepth in any case.
absl::Status CheckJsonDepth(const nlohmann::ordered_json& json, int max_depth);

// Whether `status` came from the template's own raise_exception(...).
bool IsTemplateException(const absl::Status& status);

}  // namespace jinja
}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_JINJA_H_
