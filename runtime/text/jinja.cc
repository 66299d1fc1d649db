#include "runtime/text/jinja.h"

#include <algorithm>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "runtime/core/json_limits.h"
#include "runtime/core/status.h"
#include "runtime/text/jinja_ast.h"
#include "runtime/text/jinja_builtins.h"
#include "runtime/text/jinja_parser.h"
#include "runtime/text/jinja_value.h"

namespace tessera {
namespace jinja {
namespace {

// Expressions being evaluated at once (nested, including through macro
// calls). Each costs a few hundred bytes of stack.
constexpr int kMaxEvalDepth = 1000;

// Status payloads: the line was already added; raised by raise_exception().
constexpr char kLinePayload[] = "tessera.jinja/line";
constexpr char kRaisePayload[] = "tessera.jinja/raise";

// Adds " (line N)" to an error once, at the innermost node that failed.
absl::Status AtLine(const absl::Status& status, int line) {
  if (status.ok() || status.GetPayload(kLinePayload).has_value() ||
      status.GetPayload(kRaisePayload).has_value()) {
    return status;
  }
  absl::Status out(status.code(),
                   absl::StrCat(status.message(), " (line ", line, ")"));
  out.SetPayload(kLinePayload, absl::Cord("1"));
  return out;
}

class Interpreter {
 public:
  Interpreter(const RenderOptions& options,
              absl::flat_hash_map<std::string, Value> variables)
      : options_(options), variables_(std::move(variables)) {}

  // Namespaces are the one mutable object, so they can form cycles
  // ({% set ns.x = ns %}) and chains of any length (each link set after it
  // was built), which shared ownership would leak or free recursively (one
  // stack frame per link). They all live until the render ends; then each is
  // emptied while the others are still held, so nothing is freed deeper than
  // one namespace.
  ~Interpreter() {
    for (const Value& ns : namespaces_) ns.namespace_attrs() = Dict();
  }

  absl::Status Run(const StmtList& body, std::string* out) {
    Frame* root = NewFrame(nullptr);
    Flow flow = Flow::kNormal;
    return ExecBody(body, root, out, &flow);
  }

 private:
  // Variables assigned in one scope: the template, a loop iteration, a macro
  // call. Lookups walk outwards; assignments stay in the innermost scope,
  // which is why templates carry state out of loops in namespace() objects.
  struct Frame {
    Frame* parent = nullptr;
    size_t index = 0;  // position in frames_
    absl::flat_hash_map<std::string, Value> vars;
  };

  enum class Flow { kNormal, kBreak, kContinue };

  // Frames are created and dropped in stack order. A macro keeps a pointer to
  // the scope it was defined in, so frames at or below the deepest such
  // scope stay alive until the render ends; the rest (one per loop
  // iteration, macro call, ...) go as soon as their statement is done.
  Frame* NewFrame(Frame* parent) {
    frames_.push_back(std::make_unique<Frame>());
    frames_.back()->parent = parent;
    frames_.back()->index = frames_.size() - 1;
    return frames_.back().get();
  }
  size_t FrameMark() const { return frames_.size(); }
  void ReleaseFrames(size_t mark) {
    if (pinned_frames_ <= mark && mark < frames_.size()) frames_.resize(mark);
  }

  absl::Status Step() {
    if (++steps_ > options_.max_steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          "template exceeded ", options_.max_steps, " evaluation steps"));
    }
    return absl::OkStatus();
  }

  absl::Status Append(absl::string_view text, std::string* out) const {
    out->append(text.data(), text.size());
    if (out->size() > options_.max_output_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "template output exceeded ", options_.max_output_bytes, " bytes"));
    }
    return absl::OkStatus();
  }

  // --- Statements -----------------------------------------------------------

  absl::Status ExecBody(const StmtList& body, Frame* frame, std::string* out,
                        Flow* flow) {
    for (const StmtPtr& s : body) {
      RETURN_IF_ERROR(AtLine(Exec(*s, frame, out, flow), s->line));
      if (*flow != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::Status Exec(const Stmt& s, Frame* frame, std::string* out, Flow* flow) {
    RETURN_IF_ERROR(Step());
    switch (s.kind) {
      case Stmt::Kind::kText:
        return Append(s.text, out);
      case Stmt::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr, frame));
        if (v.is_string()) return Append(v.as_string(), out);
        ASSIGN_OR_RETURN(std::string text, ToPyStr(v));
        return Append(text, out);
      }
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conds.size(); ++i) {
          ASSIGN_OR_RETURN(Value cond, Eval(*s.conds[i], frame));
          if (Truthy(cond)) return ExecBody(s.bodies[i], frame, out, flow);
        }
        return ExecBody(s.else_body, frame, out, flow);
      case Stmt::Kind::kFor:
        return ExecFor(s, frame, out);
      case Stmt::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr, frame));
        return Assign(s, frame, std::move(v));
      }
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        Flow inner = Flow::kNormal;
        const size_t mark = FrameMark();
        RETURN_IF_ERROR(ExecBody(s.body, NewFrame(frame), &captured, &inner));
        ReleaseFrames(mark);
        return Assign(s, frame, Value::String(std::move(captured)));
      }
      case Stmt::Kind::kMacro: {
        auto fn = std::make_shared<Callable>();
        fn->name = s.name;
        fn->fn = [this, &s, frame](CallArgs args) {
          return CallMacro(s, frame, std::move(args));
        };
        frame->vars[s.name] = Value::Function(std::move(fn));
        pinned_frames_ = std::max(pinned_frames_, frame->index + 1);
        return absl::OkStatus();
      }
      case Stmt::Kind::kBreak:
        *flow = Flow::kBreak;
        return absl::OkStatus();
      case Stmt::Kind::kContinue:
        *flow = Flow::kContinue;
        return absl::OkStatus();
      case Stmt::Kind::kScope: {
        Flow inner = Flow::kNormal;
        const size_t mark = FrameMark();
        RETURN_IF_ERROR(ExecBody(s.body, NewFrame(frame), out, &inner));
        ReleaseFrames(mark);
        return absl::OkStatus();
      }
    }
    return absl::InternalError("unknown statement");
  }

  // Binds `value` to the names of a for/set target (unpacking a tuple target
  // as Python does).
  absl::Status BindTargets(const std::vector<std::string>& targets, bool tuple,
                           const Value& value, Frame* frame) {
    if (!tuple) {
      frame->vars[targets[0]] = value;
      return absl::OkStatus();
    }
    if (value.is_undefined()) return UndefinedError(value);
    ASSIGN_OR_RETURN(ValueList items, Iterate(value));
    if (items.size() != targets.size()) {
      return absl::InvalidArgumentError(
          items.size() > targets.size()
              ? absl::StrCat("too many values to unpack (expected ",
                             targets.size(), ")")
              : absl::StrCat("not enough values to unpack (expected ",
                             targets.size(), ", got ", items.size(), ")"));
    }
    for (size_t i = 0; i < targets.size(); ++i) {
      frame->vars[targets[i]] = items[i];
    }
    return absl::OkStatus();
  }

  absl::Status Assign(const Stmt& s, Frame* frame, Value value) {
    if (s.attr.empty())
      return BindTargets(s.targets, s.tuple_target, value, frame);
    const Value ns = Lookup(s.targets[0], frame);
    // Only namespace() objects: the loop object is read-only, as in Jinja.
    if (!ns.is_namespace() || !namespace_ids_.contains(ns.identity())) {
      return absl::InvalidArgumentError(
          "cannot assign attribute on non-namespace object");
    }
    ns.namespace_attrs().Set(Value::String(s.attr), std::move(value));
    return absl::OkStatus();
  }

  absl::Status ExecFor(const Stmt& s, Frame* frame, std::string* out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr, frame));
    ASSIGN_OR_RETURN(ValueList items, Iterate(iterable));
    const size_t mark = FrameMark();
    if (s.filter != nullptr) {
      ValueList kept;
      for (Value& item : items) {
        Frame* scope = NewFrame(frame);
        RETURN_IF_ERROR(BindTargets(s.targets, s.tuple_target, item, scope));
        ASSIGN_OR_RETURN(Value keep, Eval(*s.filter, scope));
        ReleaseFrames(mark);
        if (Truthy(keep)) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    // Jinja's `loop` is one object that advances, so a template that keeps
    // it ({% set outer = loop %}) sees the current iteration.
    const Value loop = NewLoopObject(n);
    Dict& fields = loop.namespace_attrs();
    // Jinja runs the else block unless some iteration ran its body to the
    // end: a loop that only breaks or continues counts as not iterated.
    bool completed_any = false;
    Frame* scope = nullptr;
    for (int64_t i = 0; i < n; ++i) {
      RETURN_IF_ERROR(Step());
      UpdateLoopObject(items, i, &fields);
      // One scope per iteration: reuse the last one unless a macro defined
      // in it still needs it.
      if (scope == nullptr || scope->index < pinned_frames_) {
        ReleaseFrames(mark);
        scope = NewFrame(frame);
      } else {
        ReleaseFrames(scope->index + 1);
        scope->vars.clear();
      }
      scope->vars["loop"] = loop;
      RETURN_IF_ERROR(BindTargets(s.targets, s.tuple_target,
                                  items[static_cast<size_t>(i)], scope));
      Flow flow = Flow::kNormal;
      RETURN_IF_ERROR(ExecBody(s.body, scope, out, &flow));
      if (flow == Flow::kNormal) completed_any = true;
      if (flow == Flow::kBreak) break;
    }
    ReleaseFrames(mark);
    if (!completed_any && !s.else_body.empty()) {
      Flow flow = Flow::kNormal;
      RETURN_IF_ERROR(ExecBody(s.else_body, NewFrame(frame), out, &flow));
      ReleaseFrames(mark);
    }
    return absl::OkStatus();
  }

  // Positions of the fields of a loop object (see NewLoopObject).
  enum LoopField {
    kIndex,
    kIndex0,
    kRevindex,
    kRevindex0,
    kFirst,
    kLast,
    kPrevitem,
    kNextitem,
    kCycle,
  };

  // Jinja's LoopContext (non-recursive loops) as a mutable object whose
  // fields UpdateLoopObject sets for each iteration.
  static Value NewLoopObject(int64_t length) {
    static const char* const kNames[] = {"index",     "index0",   "revindex",
                                         "revindex0", "first",    "last",
                                         "previtem",  "nextitem", "cycle"};
    Dict fields;
    for (const char* name : kNames) {
      fields.Set(Value::String(name), Value::Undefined());
    }
    fields.Set(Value::String("length"), Value::Int(length));
    fields.Set(Value::String("depth"), Value::Int(1));
    fields.Set(Value::String("depth0"), Value::Int(0));
    // loop.changed() remembers its last arguments across iterations.
    auto last = std::make_shared<std::optional<ValueList>>();
    auto changed = std::make_shared<Callable>();
    changed->name = "loop.changed";
    changed->fn = [last](CallArgs args) -> absl::StatusOr<Value> {
      if (last->has_value() &&
          Equals(Value::List(**last), Value::List(args.args))) {
        return Value::Bool(false);
      }
      *last = std::move(args.args);
      return Value::Bool(true);
    };
    fields.Set(Value::String("changed"), Value::Function(std::move(changed)));
    return Value::NewNamespace(std::move(fields));
  }

  static void UpdateLoopObject(const ValueList& items, int64_t i,
                               Dict* fields) {
    const int64_t n = static_cast<int64_t>(items.size());
    fields->value_at(kIndex) = Value::Int(i + 1);
    fields->value_at(kIndex0) = Value::Int(i);
    fields->value_at(kRevindex) = Value::Int(n - i);
    fields->value_at(kRevindex0) = Value::Int(n - i - 1);
    fields->value_at(kFirst) = Value::Bool(i == 0);
    fields->value_at(kLast) = Value::Bool(i == n - 1);
    fields->value_at(kPrevitem) =
        i > 0 ? items[static_cast<size_t>(i - 1)]
              : Value::Undefined("there is no previous item");
    fields->value_at(kNextitem) =
        i + 1 < n ? items[static_cast<size_t>(i + 1)]
                  : Value::Undefined("there is no next item");
    auto cycle = std::make_shared<Callable>();
    cycle->name = "loop.cycle";
    cycle->fn = [i](CallArgs args) -> absl::StatusOr<Value> {
      if (args.args.empty()) {
        return absl::InvalidArgumentError("no items for cycling given");
      }
      return args.args[static_cast<size_t>(i) % args.args.size()];
    };
    fields->value_at(kCycle) = Value::Function(std::move(cycle));
  }

  absl::StatusOr<Value> CallMacro(const Stmt& macro, Frame* defining,
                                  CallArgs args) {
    if (call_depth_ >= options_.max_call_depth) {
      return absl::InvalidArgumentError(absl::StrCat(
          "macro calls nested deeper than ", options_.max_call_depth));
    }
    const std::vector<std::string>& params = macro.targets;
    if (args.args.size() > params.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("macro '", macro.name, "' takes not more than ",
                       params.size(), " argument(s)"));
    }
    const size_t mark = FrameMark();
    Frame* scope = NewFrame(defining);
    std::vector<bool> bound(params.size(), false);
    for (size_t i = 0; i < args.args.size(); ++i) {
      scope->vars[params[i]] = std::move(args.args[i]);
      bound[i] = true;
    }
    for (auto& [key, value] : args.kwargs) {
      size_t index = 0;
      while (index < params.size() && params[index] != key) ++index;
      if (index == params.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "macro '", macro.name, "' takes no keyword argument '", key, "'"));
      }
      if (bound[index]) {
        return absl::InvalidArgumentError(
            absl::StrCat("macro '", macro.name,
                         "' got multiple values for argument '", key, "'"));
      }
      scope->vars[key] = std::move(value);
      bound[index] = true;
    }
    const size_t first_default = params.size() - macro.defaults.size();
    for (size_t i = 0; i < params.size(); ++i) {
      if (bound[i]) continue;
      if (i >= first_default) {
        ASSIGN_OR_RETURN(Value d,
                         Eval(*macro.defaults[i - first_default], scope));
        scope->vars[params[i]] = std::move(d);
      } else {
        scope->vars[params[i]] = Value::Undefined(
            absl::StrCat("parameter '", params[i], "' was not provided"));
      }
    }
    ++call_depth_;
    std::string out;
    Flow flow = Flow::kNormal;
    absl::Status status = ExecBody(macro.body, scope, &out, &flow);
    --call_depth_;
    RETURN_IF_ERROR(status);
    ReleaseFrames(mark);
    return Value::String(std::move(out));
  }

  // --- Names ----------------------------------------------------------------

  Value Lookup(const std::string& name, Frame* frame) {
    for (Frame* f = frame; f != nullptr; f = f->parent) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return it->second;
    }
    auto it = variables_.find(name);
    if (it != variables_.end()) return it->second;
    Value global = Global(name);
    if (!global.is_undefined()) return global;
    return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
  }

  static Value MakeFunction(std::string name,
                            std::function<absl::StatusOr<Value>(CallArgs)> fn) {
    auto callable = std::make_shared<Callable>();
    callable->name = std::move(name);
    callable->fn = std::move(fn);
    return Value::Function(std::move(callable));
  }

  // Jinja's default globals and the two transformers adds.
  Value Global(const std::string& name) {
    auto cached = globals_.find(name);
    if (cached != globals_.end()) return cached->second;
    Value fn;
    if (name == "range") {
      fn = MakeFunction(name, Range);
    } else if (name == "namespace") {
      fn = MakeFunction(name, [this](CallArgs args) -> absl::StatusOr<Value> {
        ASSIGN_OR_RETURN(Dict attrs, DictFromArgs("namespace", args));
        Value ns = Value::NewNamespace(std::move(attrs));
        namespaces_.push_back(ns);
        namespace_ids_.insert(ns.identity());
        return ns;
      });
    } else if (name == "dict") {
      fn = MakeFunction(name, [](CallArgs args) -> absl::StatusOr<Value> {
        ASSIGN_OR_RETURN(Dict d, DictFromArgs("dict", args));
        return Value::FromDict(std::move(d));
      });
    } else if (name == "raise_exception") {
      fn = MakeFunction(name, [](CallArgs args) -> absl::StatusOr<Value> {
        std::string message;
        if (!args.args.empty()) {
          ASSIGN_OR_RETURN(message, ToPyStr(args.args[0]));
        }
        absl::Status raised = absl::InvalidArgumentError(message);
        raised.SetPayload(kRaisePayload, absl::Cord("1"));
        return raised;
      });
    } else if (name == "strftime_now") {
      fn = MakeFunction(name, [this](CallArgs args) -> absl::StatusOr<Value> {
        if (args.args.size() != 1 || !args.args[0].is_string()) {
          return absl::InvalidArgumentError(
              "strftime_now() takes one format string");
        }
        return Value::String(StrftimeNow(args.args[0].as_string()));
      });
    } else if (name == "lipsum" || name == "cycler" || name == "joiner") {
      fn = MakeFunction(name, [name](CallArgs) -> absl::StatusOr<Value> {
        return absl::UnimplementedError(
            absl::StrCat("unsupported function \"", name, "\""));
      });
    } else {
      return Value::Undefined();
    }
    globals_[name] = fn;
    return fn;
  }

  static absl::StatusOr<Value> Range(CallArgs args) {
    if (!args.kwargs.empty() || args.args.empty() || args.args.size() > 3) {
      return absl::InvalidArgumentError("range() takes 1 to 3 integers");
    }
    std::vector<int64_t> v;
    for (const Value& a : args.args) {
      if (!a.is_int() && !a.is_bool()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", TypeName(a), "' object cannot be interpreted as an integer"));
      }
      v.push_back(a.as_integer());
    }
    const int64_t start = v.size() == 1 ? 0 : v[0];
    const int64_t stop = v.size() == 1 ? v[0] : v[1];
    const int64_t step = v.size() == 3 ? v[2] : 1;
    if (step == 0) {
      return absl::InvalidArgumentError("range() arg 3 must not be zero");
    }
    // The sandbox's MAX_RANGE.
    constexpr int64_t kMaxRange = 100000;
    const int64_t span = step > 0 ? stop - start : start - stop;
    const int64_t abs_step = step > 0 ? step : -step;
    const int64_t count = span <= 0 ? 0 : (span - 1) / abs_step + 1;
    if (count > kMaxRange) {
      return absl::InvalidArgumentError(
          "Range too big. The sandbox blocks ranges larger than MAX_RANGE "
          "(100000).");
    }
    ValueList items;
    items.reserve(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k)
      items.push_back(Value::Int(start + k * step));
    return Value::List(std::move(items));
  }

  // dict(mapping_or_pairs, **kwargs), as namespace() and dict() take them.
  static absl::StatusOr<Dict> DictFromArgs(absl::string_view fn,
                                           const CallArgs& args) {
    Dict d;
    if (args.args.size() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, "() takes at most 1 positional argument"));
    }
    if (!args.args.empty()) {
      const Value& init = args.args[0];
      if (init.is_dict()) {
        d = init.as_dict();
      } else {
        ASSIGN_OR_RETURN(ValueList pairs, Iterate(init));
        for (const Value& pair : pairs) {
          ASSIGN_OR_RETURN(ValueList kv, Iterate(pair));
          if (kv.size() != 2) {
            return absl::InvalidArgumentError(
                absl::StrCat(fn, "(): sequence elements must have length 2"));
          }
          d.Set(kv[0], kv[1]);
        }
      }
    }
    for (const auto& [key, value] : args.kwargs) {
      d.Set(Value::String(key), value);
    }
    return d;
  }

  std::string StrftimeNow(const std::string& format) const {
    const std::time_t now =
        options_.clock ? options_.clock() : std::time(nullptr);
    std::tm local = {};
    localtime_r(&now, &local);
    if (format.empty()) return "";
    std::vector<char> buf(256);
    while (true) {
      const size_t n =
          std::strftime(buf.data(), buf.size(), format.c_str(), &local);
      if (n > 0 || buf.size() > 65536) return std::string(buf.data(), n);
      buf.resize(buf.size() * 4);
    }
  }

  // --- Expressions ----------------------------------------------------------

  absl::StatusOr<Value> Eval(const Expr& e, Frame* frame) {
    // Parsing bounds one expression's depth; this bounds the total through
    // macro calls, so that no template can exhaust the C++ stack.
    if (eval_depth_ >= kMaxEvalDepth) {
      return absl::InvalidArgumentError("template nested too deeply");
    }
    ++eval_depth_;
    absl::StatusOr<Value> v = EvalInner(e, frame);
    --eval_depth_;
    if (!v.ok()) return AtLine(v.status(), e.line);
    // Every value a template builds passes here, so no list or dict is ever
    // deeper than kMaxValueDepth + 1 and the walks over them stay bounded.
    if (v->depth() > kMaxValueDepth) {
      return AtLine(
          absl::InvalidArgumentError(absl::StrCat("value nested deeper than ",
                                                  kMaxValueDepth, " levels")),
          e.line);
    }
    return v;
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, Frame* frame) {
    CallArgs args;
    for (size_t i = 0; i < e.num_args; ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.operands[1 + i], frame));
      args.args.push_back(std::move(v));
    }
    for (size_t i = 0; i < e.kwarg_names.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.operands[1 + e.num_args + i], frame));
      args.kwargs.emplace_back(e.kwarg_names[i], std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> EvalInner(const Expr& e, Frame* frame) {
    RETURN_IF_ERROR(Step());
    switch (e.kind) {
      case Expr::Kind::kConst:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name, frame);
      case Expr::Kind::kGetAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0], frame));
        if (obj.is_undefined()) return UndefinedError(obj);
        return GetAttr(obj, e.name);
      }
      case Expr::Kind::kGetItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0], frame));
        if (obj.is_undefined()) return UndefinedError(obj);
        const Expr& index = *e.operands[1];
        if (index.kind == Expr::Kind::kSlice) {
          Value parts[3] = {Value::None(), Value::None(), Value::None()};
          for (int i = 0; i < 3; ++i) {
            if (index.operands[i] != nullptr) {
              ASSIGN_OR_RETURN(parts[i], Eval(*index.operands[i], frame));
            }
          }
          return GetSlice(obj, parts[0], parts[1], parts[2]);
        }
        ASSIGN_OR_RETURN(Value key, Eval(index, frame));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice:
        return absl::InvalidArgumentError("slice outside of []");
      case Expr::Kind::kCall: {
        ASSIGN_OR_RETURN(Value callee, Eval(*e.operands[0], frame));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
        if (callee.is_undefined()) return UndefinedError(callee);
        if (!callee.is_callable()) {
          return absl::InvalidArgumentError(
              absl::StrCat("'", TypeName(callee), "' object is not callable"));
        }
        return callee.as_callable().fn(std::move(args));
      }
      case Expr::Kind::kFilter: {
        ASSIGN_OR_RETURN(Value operand, Eval(*e.operands[0], frame));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
        return ApplyFilter(e.name, operand, args);
      }
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value operand, Eval(*e.operands[0], frame));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
        ASSIGN_OR_RETURN(bool passed, ApplyTest(e.name, operand, args));
        return Value::Bool(passed != e.negated);
      }
      case Expr::Kind::kUnary: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0], frame));
        if (v.is_undefined()) return UndefinedError(v);
        if (!v.is_number()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "bad operand type for unary ", e.name, ": '", TypeName(v), "'"));
        }
        if (e.name == "+") {
          return v.is_float() ? v : Value::Int(v.as_integer());
        }
        if (v.is_float()) return Value::Float(-v.as_float());
        if (v.as_integer() == INT64_MIN) {
          return absl::OutOfRangeError("integer overflow (beyond 64 bits)");
        }
        return Value::Int(-v.as_integer());
      }
      case Expr::Kind::kBinary: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.operands[0], frame));
        ASSIGN_OR_RETURN(Value b, Eval(*e.operands[1], frame));
        return BinaryOp(e.name, a, b);
      }
      case Expr::Kind::kAnd: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.operands[0], frame));
        if (!Truthy(a)) return a;
        return Eval(*e.operands[1], frame);
      }
      case Expr::Kind::kOr: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.operands[0], frame));
        if (Truthy(a)) return a;
        return Eval(*e.operands[1], frame);
      }
      case Expr::Kind::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0], frame));
        return Value::Bool(!Truthy(v));
      }
      case Expr::Kind::kCompare: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.operands[0], frame));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          ASSIGN_OR_RETURN(Value right, Eval(*e.operands[i + 1], frame));
          ASSIGN_OR_RETURN(bool holds, CompareOp(e.ops[i], left, right));
          if (!holds) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kConcat: {
        std::string text;
        for (const ExprPtr& operand : e.operands) {
          ASSIGN_OR_RETURN(Value v, Eval(*operand, frame));
          if (v.is_string()) {
            text += v.as_string();
          } else {
            ASSIGN_OR_RETURN(std::string piece, ToPyStr(v));
            text += piece;
          }
          if (text.size() > options_.max_output_bytes) {
            return absl::InvalidArgumentError("string too long");
          }
        }
        return Value::String(std::move(text));
      }
      case Expr::Kind::kCond: {
        ASSIGN_OR_RETURN(Value cond, Eval(*e.operands[1], frame));
        if (Truthy(cond)) return Eval(*e.operands[0], frame);
        if (e.operands[2] == nullptr) {
          return Value::Undefined(absl::StrCat(
              "the inline if-expression on line ", e.line,
              " evaluated to false and no else section was defined."));
        }
        return Eval(*e.operands[2], frame);
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const ExprPtr& operand : e.operands) {
          ASSIGN_OR_RETURN(Value v, Eval(*operand, frame));
          items.push_back(std::move(v));
        }
        return Value::List(std::move(items), e.kind == Expr::Kind::kTuple
                                                 ? ListFlavor::kTuple
                                                 : ListFlavor::kList);
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.operands.size(); i += 2) {
          ASSIGN_OR_RETURN(Value key, Eval(*e.operands[i], frame));
          ASSIGN_OR_RETURN(Value value, Eval(*e.operands[i + 1], frame));
          d.Set(std::move(key), std::move(value));
        }
        return Value::FromDict(std::move(d));
      }
    }
    return absl::InternalError("unknown expression");
  }

  static absl::StatusOr<bool> CompareOp(const std::string& op, const Value& a,
                                        const Value& b) {
    if (op == "==") return Equals(a, b);
    if (op == "!=") return !Equals(a, b);
    if (op == "in") return Contains(b, a);
    if (op == "notin") {
      ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return !in;
    }
    if (a.is_undefined()) return UndefinedError(a);
    if (b.is_undefined()) return UndefinedError(b);
    absl::StatusOr<int> c = Compare(a, b);
    if (!c.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", op, "' not supported between instances of '",
                       TypeName(a), "' and '", TypeName(b), "'"));
    }
    if (op == "<") return *c < 0;
    if (op == "<=") return *c <= 0;
    if (op == ">") return *c > 0;
    return *c >= 0;
  }

  const RenderOptions& options_;
  const absl::flat_hash_map<std::string, Value> variables_;
  absl::flat_hash_map<std::string, Value> globals_;
  std::vector<std::unique_ptr<Frame>> frames_;
  size_t pinned_frames_ = 0;  // frames_[0, pinned_frames_) hold macros
  // Every namespace() made by this render (see ~Interpreter).
  std::vector<Value> namespaces_;
  absl::flat_hash_set<const void*> namespace_ids_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
};

}  // namespace

absl::StatusOr<Template> Template::Parse(absl::string_view source) {
  ASSIGN_OR_RETURN(StmtList body, jinja::Parse(source));
  Template t;
  t.body_ = std::make_shared<const StmtList>(std::move(body));
  return t;
}

absl::StatusOr<std::string> Template::Render(
    const nlohmann::ordered_json& variables,
    const RenderOptions& options) const {
  if (!variables.is_object()) {
    return absl::InvalidArgumentError(
        "template variables must be a JSON object");
  }
  absl::flat_hash_map<std::string, Value> vars;
  for (const auto& [name, value] : variables.items()) {
    absl::StatusOr<Value> v = FromJson(value, kMaxJsonDepth);
    if (!v.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable \"", name, "\": ", v.status().message()));
    }
    vars[name] = *std::move(v);
  }
  Interpreter interpreter(options, std::move(vars));
  std::string out;
  RETURN_IF_ERROR(interpreter.Run(*body_, &out));
  return out;
}

bool IsTemplateException(const absl::Status& status) {
  return status.GetPayload(kRaisePayload).has_value();
}

}  // namespace jinja
}  // namespace tessera
