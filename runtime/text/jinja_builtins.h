// Jinja's builtin filters and tests, Python's operators, and the attribute,
// item and method rules of jinja2.sandbox.ImmutableSandboxedEnvironment
// (internal to runtime/text/jinja*).
//
// Each follows the Python it stands for (jinja2/filters.py, jinja2/tests.py,
// the str/dict/list methods) so that what a template prints matches
// transformers. Where a Jinja filter, test or Python method exists but is not
// implemented here, the call fails with Unimplemented naming it (the
// interpreter adds the line): `unsupported filter "wordwrap"`.
#ifndef TESSERA_RUNTIME_TEXT_JINJA_BUILTINS_H_
#define TESSERA_RUNTIME_TEXT_JINJA_BUILTINS_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/text/jinja_value.h"

namespace tessera {
namespace jinja {

// Whether Jinja 3.1 (plus transformers' overrides) has a filter/test of this
// name. Jinja rejects other names when it compiles a template.
bool IsJinjaFilter(absl::string_view name);
bool IsJinjaTest(absl::string_view name);

// The error an Undefined raises when used (printing and testing it are fine).
absl::Status UndefinedError(const Value& undefined);

// `obj.name` with the sandbox's getattr: Python attributes (methods of str,
// dict, list) first, then the item; missing -> Undefined; mutating methods
// (list.append, dict.update) -> an Undefined that fails if called. `obj` must
// not be Undefined (the caller raises).
Value GetAttr(const Value& obj, absl::string_view name);

// `obj[key]` with the sandbox's getitem: the item first, then (for a string
// key) the attribute; a missing item or index -> Undefined.
Value GetItem(const Value& obj, const Value& key);

// `obj[start:stop:step]`; null parts are None.
absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start,
                               const Value& stop, const Value& step);

// Python's binary operators: + - * / // % **.
absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a,
                               const Value& b);

// Python's `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

// The items `for x in v` visits: list items, dict keys, string characters;
// nothing for Undefined.
absl::StatusOr<ValueList> Iterate(const Value& v);

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& operand,
                                  const CallArgs& args);
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& operand,
                               const CallArgs& args);

// `receiver.name(args)` for the str, dict and list methods templates use.
absl::StatusOr<Value> CallMethod(const Value& receiver, absl::string_view name,
                                 const CallArgs& args);

}  // namespace jinja
}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_JINJA_BUILTINS_H_
