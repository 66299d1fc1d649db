// Syntax tree of a parsed Jinja template (internal to runtime/text/jinja*).
//
// One node type per layer (Expr, Stmt) with a kind tag rather than a class per
// construct: the interpreter switches on the kind, and the few fields each
// kind uses are documented beside it.
#ifndef TESSERA_RUNTIME_TEXT_JINJA_AST_H_
#define TESSERA_RUNTIME_TEXT_JINJA_AST_H_

#include <memory>
#include <string>
#include <vector>

#include "runtime/text/jinja_value.h"

namespace tessera {
namespace jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kConst,    // value
    kName,     // name
    kGetAttr,  // operands[0].name
    kGetItem,  // operands[0][operands[1]]; operands[1] may be a kSlice
    kSlice,    // operands: start, stop, step (each may be null)
    kCall,     // operands[0](args...)
    kFilter,   // operands[0] | name(args...)
    kTest,     // operands[0] is [not] name(args...)
    kUnary,    // name ("-" or "+") operands[0]
    kBinary,   // operands[0] name operands[1]; name: + - * / // % **
    kAnd,      // operands[0] and operands[1]
    kOr,       // operands[0] or operands[1]
    kNot,      // not operands[0]
    kCompare,  // operands[0] ops[0] operands[1] ops[1] operands[2] ...
    kConcat,   // operands[0] ~ operands[1] ~ ...
    kCond,     // operands[0] if operands[1] else operands[2] (may be null)
    kList,     // [operands...]
    kTuple,    // (operands...)
    kDict,     // {operands[0]: operands[1], ...}
  };

  Kind kind = Kind::kConst;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> operands;
  // kCompare: "==", "!=", "<", "<=", ">", ">=", "in", "notin".
  std::vector<std::string> ops;
  // kCall, kFilter, kTest: operands[0] is the callee/subject, then
  // `num_args` positional arguments, then one operand per kwarg_names entry.
  size_t num_args = 0;
  std::vector<std::string> kwarg_names;
  bool negated = false;  // kTest: "is not"
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // if conds[0] body[0] elif conds[1] body[1] ... else else_body
    kFor,       // for targets in expr [if filter] body [else else_body]
    kSet,       // set targets = expr, or set targets[0].attr = expr
    kSetBlock,  // set targets[0] %} body {% endset
    kMacro,     // macro name(targets = defaults...) body
    kBreak,
    kContinue,
    kScope,  // {% generation %} body {% endgeneration %}: body in a new scope
  };

  Kind kind = Kind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  std::vector<ExprPtr> conds;
  std::vector<StmtList> bodies;  // kIf: one per cond
  StmtList body;
  StmtList else_body;
  // Names assigned (for/set) or macro parameter names.
  std::vector<std::string> targets;
  bool tuple_target = false;  // `for a, b in` / `set a, b =`
  std::string attr;           // kSet on a namespace: `set ns.attr = ...`
  ExprPtr filter;             // kFor: `if` condition
  std::string name;           // kMacro
  // kMacro: defaults for the last defaults.size() parameters.
  std::vector<ExprPtr> defaults;
};

}  // namespace jinja
}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_JINJA_AST_H_
