#include "runtime/text/jinja_parser.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/core/status.h"
#include "runtime/text/jinja_builtins.h"
#include "runtime/text/jinja_lexer.h"

namespace tessera {
namespace jinja {
namespace {

// Deep enough for any real template; shallow enough that a hostile one cannot
// overflow the stack of the recursive-descent parser or the evaluator.
constexpr int kMaxNesting = 200;

std::string Describe(const Token& t) {
  switch (t.type) {
    case TokenType::kData:
      return "template data";
    case TokenType::kVariableBegin:
      return "'{{'";
    case TokenType::kVariableEnd:
      return "end of print statement";
    case TokenType::kBlockBegin:
      return "'{%'";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kEof:
      return "end of template";
    case TokenType::kString:
      return "string";
    default:
      return absl::StrCat("'", t.value, "'");
  }
}

// Restores the parser's nesting counter when a parse function returns.
class DepthScope {
 public:
  explicit DepthScope(int* depth) : depth_(depth), saved_(*depth) {}
  ~DepthScope() { *depth_ = saved_; }
  DepthScope(const DepthScope&) = delete;
  DepthScope& operator=(const DepthScope&) = delete;

 private:
  int* depth_;
  int saved_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<StmtList> ParseTemplate() {
    StmtList body;
    RETURN_IF_ERROR(Subparse({}, &body));
    return body;
  }

 private:
  using Names = std::vector<absl::string_view>;

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Look() const {
    return tokens_[pos_ + 1 < tokens_.size() ? pos_ + 1 : pos_];
  }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(absl::string_view op) const {
    return Cur().type == TokenType::kOperator && Cur().value == op;
  }
  bool IsName(absl::string_view name) const {
    return Cur().type == TokenType::kName && Cur().value == name;
  }
  bool SkipOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(absl::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }

  absl::Status Error(absl::string_view message) const {
    return Error(Cur().line, message);
  }
  static absl::Status Error(int line, absl::string_view message) {
    return absl::InvalidArgumentError(
        absl::StrCat("syntax error: ", message, " (line ", line, ")"));
  }
  absl::Status Unexpected(absl::string_view expected) const {
    return Error(
        absl::StrCat("expected ", expected, ", got ", Describe(Cur())));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!SkipOp(op)) return Unexpected(absl::StrCat("'", op, "'"));
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectNameToken() {
    if (Cur().type != TokenType::kName) return Unexpected("a name");
    std::string name = Cur().value;
    Next();
    return name;
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) {
      return Unexpected("end of statement block");
    }
    Next();
    return absl::OkStatus();
  }

  // One more level of nesting in the tree being built (a recursive call, or
  // one more link in a left-nested chain such as a + b + c or x|f|g).
  absl::Status Deeper() {
    if (++depth_ > kMaxNesting) return Error("expression nested too deeply");
    return absl::OkStatus();
  }

  static ExprPtr NewExpr(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // --- Statements -----------------------------------------------------------

  // Parses template data and tags until a block tag named in `end_names`,
  // and leaves the parser on that name.
  absl::Status Subparse(const Names& end_names, StmtList* out) {
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case TokenType::kData: {
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Kind::kText;
          s->line = t.line;
          s->text = t.value;
          out->push_back(std::move(s));
          Next();
          break;
        }
        case TokenType::kVariableBegin: {
          const int line = t.line;
          Next();
          ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true, {}, false));
          if (Cur().type != TokenType::kVariableEnd) {
            return Unexpected("end of print statement");
          }
          Next();
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Kind::kOutput;
          s->line = line;
          s->expr = std::move(e);
          out->push_back(std::move(s));
          break;
        }
        case TokenType::kBlockBegin: {
          Next();
          if (Cur().type == TokenType::kName) {
            for (absl::string_view end : end_names) {
              if (Cur().value == end) return absl::OkStatus();
            }
          }
          RETURN_IF_ERROR(ParseStatement(end_names, out));
          RETURN_IF_ERROR(ExpectBlockEnd());
          break;
        }
        case TokenType::kEof:
          if (!end_names.empty()) {
            std::string expected;
            for (absl::string_view end : end_names) {
              absl::StrAppend(&expected, expected.empty() ? "" : " or ", "'",
                              end, "'");
            }
            return Error(absl::StrCat("unexpected end of template, expected ",
                                      expected));
          }
          return absl::OkStatus();
        default:
          return Error(absl::StrCat("unexpected ", Describe(t)));
      }
    }
  }

  // `%}`, the body up to a tag in `end_names`; with drop_needle, also skips
  // that tag's name (its `%}` is then consumed by Subparse).
  absl::Status ParseStatements(const Names& end_names, bool drop_needle,
                               StmtList* out) {
    SkipOp(":");
    RETURN_IF_ERROR(ExpectBlockEnd());
    RETURN_IF_ERROR(Subparse(end_names, out));
    if (drop_needle) Next();
    return absl::OkStatus();
  }

  absl::Status ParseStatement(const Names& end_names, StmtList* out) {
    if (Cur().type != TokenType::kName) return Unexpected("a statement name");
    const std::string& name = Cur().value;
    if (++depth_ > kMaxNesting) return Error("template nested too deeply");
    absl::Status status;
    if (name == "for") {
      status = ParseFor(out);
    } else if (name == "if") {
      status = ParseIf(out);
    } else if (name == "set") {
      status = ParseSet(out);
    } else if (name == "macro") {
      status = ParseMacro(out);
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) {
        status = Error(absl::StrCat("'", name, "' outside of a loop"));
      } else {
        auto s = std::make_unique<Stmt>();
        s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
        s->line = Cur().line;
        Next();
        out->push_back(std::move(s));
      }
    } else if (name == "generation") {
      // transformers' AssistantTracker tag: marks assistant text, renders
      // its body as is (in its own scope, like Jinja's call blocks).
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Kind::kScope;
      s->line = Cur().line;
      Next();
      status = ParseStatements({"endgeneration"}, true, &s->body);
      out->push_back(std::move(s));
    } else if (name == "filter" || name == "call" || name == "with" ||
               name == "include" || name == "import" || name == "from" ||
               name == "extends" || name == "block" || name == "autoescape") {
      status = absl::UnimplementedError(absl::StrCat(
          "unsupported statement \"", name, "\" (line ", Cur().line, ")"));
    } else {
      std::string message = absl::StrCat("unknown tag \"", name, "\"");
      if (!end_names.empty()) {
        absl::StrAppend(&message, ", expected '", end_names[0], "'");
      }
      status = Error(message);
    }
    --depth_;
    return status;
  }

  absl::Status ParseFor(StmtList* out) {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::kFor;
    s->line = Cur().line;
    Next();
    RETURN_IF_ERROR(ParseAssignTargets("in", &s->targets, &s->tuple_target));
    if (!SkipName("in")) return Unexpected("'in'");
    ASSIGN_OR_RETURN(s->expr, ParseTuple(false, {"recursive"}, false));
    if (SkipName("if")) {
      ASSIGN_OR_RETURN(s->filter, ParseExpression(true));
    }
    if (IsName("recursive")) {
      return absl::UnimplementedError(absl::StrCat(
          "unsupported statement \"for ... recursive\" (line ", s->line, ")"));
    }
    ++loop_depth_;
    absl::Status status = ParseStatements({"endfor", "else"}, false, &s->body);
    --loop_depth_;
    RETURN_IF_ERROR(status);
    if (SkipName("else")) {
      RETURN_IF_ERROR(ParseStatements({"endfor"}, true, &s->else_body));
    } else {
      Next();  // endfor
    }
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseIf(StmtList* out) {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::kIf;
    s->line = Cur().line;
    Next();
    while (true) {
      ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false, {}, false));
      StmtList body;
      RETURN_IF_ERROR(ParseStatements({"elif", "else", "endif"}, false, &body));
      s->conds.push_back(std::move(cond));
      s->bodies.push_back(std::move(body));
      if (SkipName("elif")) continue;
      if (SkipName("else")) {
        RETURN_IF_ERROR(ParseStatements({"endif"}, true, &s->else_body));
      } else {
        Next();  // endif
      }
      break;
    }
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseSet(StmtList* out) {
    auto s = std::make_unique<Stmt>();
    s->line = Cur().line;
    Next();
    if (Cur().type == TokenType::kName && Look().type == TokenType::kOperator &&
        Look().value == ".") {
      s->targets.push_back(Cur().value);
      Next();
      Next();
      ASSIGN_OR_RETURN(s->attr, ExpectNameToken());
    } else {
      RETURN_IF_ERROR(ParseAssignTargets("", &s->targets, &s->tuple_target));
    }
    if (SkipOp("=")) {
      s->kind = Stmt::Kind::kSet;
      ASSIGN_OR_RETURN(s->expr, ParseTuple(true, {}, false));
    } else {
      if (IsOp("|")) {
        return absl::UnimplementedError(absl::StrCat(
            "unsupported statement \"set ... | filter\" (line ", s->line, ")"));
      }
      if (s->tuple_target) return Error("cannot assign a block to a tuple");
      s->kind = Stmt::Kind::kSetBlock;
      RETURN_IF_ERROR(ParseStatements({"endset"}, true, &s->body));
    }
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseMacro(StmtList* out) {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::kMacro;
    s->line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(s->name, ExpectNameToken());
    RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!s->targets.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(std::string param, ExpectNameToken());
      if (SkipOp("=")) {
        ASSIGN_OR_RETURN(ExprPtr d, ParseExpression(true));
        s->defaults.push_back(std::move(d));
      } else if (!s->defaults.empty()) {
        return Error("non-default argument follows default argument");
      }
      s->targets.push_back(std::move(param));
    }
    Next();
    // A loop around the macro definition does not make `break` valid in it.
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    absl::Status status = ParseStatements({"endmacro"}, true, &s->body);
    loop_depth_ = saved_loop_depth;
    RETURN_IF_ERROR(status);
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  // `a`, `a, b`, `(a, b)`: the names a for/set statement assigns.
  absl::Status ParseAssignTargets(absl::string_view end_name,
                                  std::vector<std::string>* targets,
                                  bool* tuple) {
    const bool parenthesized = SkipOp("(");
    while (true) {
      ASSIGN_OR_RETURN(std::string name, ExpectNameToken());
      if (name == "true" || name == "false" || name == "none" ||
          name == "True" || name == "False" || name == "None") {
        return Error(absl::StrCat("cannot assign to '", name, "'"));
      }
      targets->push_back(std::move(name));
      if (!SkipOp(",")) break;
      *tuple = true;
      if (parenthesized ? IsOp(")")
                        : (IsOp("=") || Cur().type == TokenType::kBlockEnd ||
                           (!end_name.empty() && IsName(end_name)))) {
        break;
      }
    }
    if (parenthesized) {
      *tuple = true;
      RETURN_IF_ERROR(ExpectOp(")"));
    }
    return absl::OkStatus();
  }

  // --- Expressions ----------------------------------------------------------

  bool IsTupleEnd(const Names& extra_end) const {
    if (Cur().type == TokenType::kVariableEnd ||
        Cur().type == TokenType::kBlockEnd || IsOp(")")) {
      return true;
    }
    for (absl::string_view name : extra_end) {
      if (IsName(name)) return true;
    }
    return false;
  }

  // An expression, or a comma-separated tuple of them.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, const Names& extra_end,
                                     bool explicit_parentheses) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(extra_end)) break;
      ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(with_condexpr));
      items.push_back(std::move(e));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) return Unexpected("an expression");
    }
    ExprPtr t = NewExpr(Expr::Kind::kTuple, line);
    t->operands = std::move(items);
    return t;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    if (++depth_ > kMaxNesting) return Error("expression nested too deeply");
    absl::StatusOr<ExprPtr> e = with_condexpr ? ParseCondExpr() : ParseOr();
    --depth_;
    return e;
  }

  absl::StatusOr<ExprPtr> ParseCondExpr() {
    DepthScope scope(&depth_);
    ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (IsName("if")) {
      RETURN_IF_ERROR(Deeper());
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr otherwise;
      if (SkipName("else")) {
        ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
      }
      ExprPtr c = NewExpr(Expr::Kind::kCond, line);
      c->operands.push_back(std::move(expr));
      c->operands.push_back(std::move(cond));
      c->operands.push_back(std::move(otherwise));
      expr = std::move(c);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    DepthScope scope(&depth_);
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      RETURN_IF_ERROR(Deeper());
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = Binary(Expr::Kind::kOr, "or", std::move(left), std::move(right),
                    line);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    DepthScope scope(&depth_);
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      RETURN_IF_ERROR(Deeper());
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = Binary(Expr::Kind::kAnd, "and", std::move(left), std::move(right),
                    line);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      const int line = Cur().line;
      Next();
      if (++depth_ > kMaxNesting) return Error("expression nested too deeply");
      absl::StatusOr<ExprPtr> operand = ParseNot();
      --depth_;
      if (!operand.ok()) return operand.status();
      ExprPtr e = NewExpr(Expr::Kind::kNot, line);
      e->operands.push_back(std::move(*operand));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOperator &&
          (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" ||
           Cur().value == "<=" || Cur().value == ">" || Cur().value == ">=")) {
        op = Cur().value;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Look().type == TokenType::kName &&
                 Look().value == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      if (cmp == nullptr) {
        cmp = NewExpr(Expr::Kind::kCompare, line);
        cmp->operands.push_back(std::move(first));
      }
      cmp->ops.push_back(std::move(op));
      cmp->operands.push_back(std::move(operand));
    }
    return cmp != nullptr ? std::move(cmp) : std::move(first);
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    DepthScope scope(&depth_);
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      RETURN_IF_ERROR(Deeper());
      const std::string op = Cur().value;
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      left = Binary(Expr::Kind::kBinary, op, std::move(left), std::move(right),
                    line);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    if (!IsOp("~")) return first;
    ExprPtr c = NewExpr(Expr::Kind::kConcat, line);
    c->operands.push_back(std::move(first));
    while (SkipOp("~")) {
      ASSIGN_OR_RETURN(ExprPtr next, ParseMath2());
      c->operands.push_back(std::move(next));
    }
    return c;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    DepthScope scope(&depth_);
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      RETURN_IF_ERROR(Deeper());
      const std::string op = Cur().value;
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      left = Binary(Expr::Kind::kBinary, op, std::move(left), std::move(right),
                    line);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    DepthScope scope(&depth_);
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      RETURN_IF_ERROR(Deeper());
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      left = Binary(Expr::Kind::kBinary, "**", std::move(left),
                    std::move(right), line);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    if (++depth_ > kMaxNesting) return Error("expression nested too deeply");
    absl::StatusOr<ExprPtr> e = ParseUnaryInner(with_filter);
    --depth_;
    return e;
  }

  absl::StatusOr<ExprPtr> ParseUnaryInner(bool with_filter) {
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = NewExpr(Expr::Kind::kUnary, Cur().line);
      node->name = Cur().value;
      Next();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node->operands.push_back(std::move(operand));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    const int line = t.line;
    if (t.type == TokenType::kName) {
      ExprPtr e;
      if (t.value == "true" || t.value == "True" || t.value == "false" ||
          t.value == "False") {
        e = NewExpr(Expr::Kind::kConst, line);
        e->value = Value::Bool(t.value == "true" || t.value == "True");
      } else if (t.value == "none" || t.value == "None") {
        e = NewExpr(Expr::Kind::kConst, line);
        e->value = Value::None();
      } else {
        e = NewExpr(Expr::Kind::kName, line);
        e->name = t.value;
      }
      Next();
      return e;
    }
    if (t.type == TokenType::kString) {
      // Adjacent literals concatenate, as in Python.
      std::string text;
      while (Cur().type == TokenType::kString) {
        text += Cur().value;
        Next();
      }
      ExprPtr e = NewExpr(Expr::Kind::kConst, line);
      e->value = Value::String(std::move(text));
      return e;
    }
    if (t.type == TokenType::kInteger || t.type == TokenType::kFloat) {
      ExprPtr e = NewExpr(Expr::Kind::kConst, line);
      e->value = t.type == TokenType::kInteger ? Value::Int(t.int_value)
                                               : Value::Float(t.float_value);
      Next();
      return e;
    }
    if (IsOp("(")) {
      Next();
      ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true, {}, true));
      RETURN_IF_ERROR(ExpectOp(")"));
      return e;
    }
    if (IsOp("[")) return ParseList();
    if (IsOp("{")) return ParseDict();
    return Error(absl::StrCat("unexpected ", Describe(t)));
  }

  absl::StatusOr<ExprPtr> ParseList() {
    ExprPtr e = NewExpr(Expr::Kind::kList, Cur().line);
    Next();
    while (!IsOp("]")) {
      if (!e->operands.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("]")) break;
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      e->operands.push_back(std::move(item));
    }
    Next();
    return e;
  }

  absl::StatusOr<ExprPtr> ParseDict() {
    ExprPtr e = NewExpr(Expr::Kind::kDict, Cur().line);
    Next();
    while (!IsOp("}")) {
      if (!e->operands.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("}")) break;
      ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
      RETURN_IF_ERROR(ExpectOp(":"));
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      e->operands.push_back(std::move(key));
      e->operands.push_back(std::move(value));
    }
    Next();
    return e;
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    DepthScope scope(&depth_);
    while (true) {
      RETURN_IF_ERROR(Deeper());
      if (IsOp(".") || IsOp("[")) {
        ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    DepthScope scope(&depth_);
    while (true) {
      RETURN_IF_ERROR(Deeper());
      if (IsOp("|")) {
        ASSIGN_OR_RETURN(node, ParseFilter(std::move(node)));
      } else if (IsName("is")) {
        ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const int line = Cur().line;
    if (SkipOp(".")) {
      if (Cur().type == TokenType::kName) {
        ExprPtr e = NewExpr(Expr::Kind::kGetAttr, line);
        e->name = Cur().value;
        e->operands.push_back(std::move(node));
        Next();
        return e;
      }
      if (Cur().type == TokenType::kInteger) {
        ExprPtr index = NewExpr(Expr::Kind::kConst, line);
        index->value = Value::Int(Cur().int_value);
        Next();
        ExprPtr e = NewExpr(Expr::Kind::kGetItem, line);
        e->operands.push_back(std::move(node));
        e->operands.push_back(std::move(index));
        return e;
      }
      return Unexpected("a name or number");
    }
    Next();  // [
    std::vector<ExprPtr> args;
    while (!IsOp("]")) {
      if (!args.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(ExprPtr arg, ParseSubscribed());
      args.push_back(std::move(arg));
    }
    Next();
    ExprPtr e = NewExpr(Expr::Kind::kGetItem, line);
    e->operands.push_back(std::move(node));
    if (args.size() == 1) {
      e->operands.push_back(std::move(args[0]));
    } else {
      ExprPtr t = NewExpr(Expr::Kind::kTuple, line);
      t->operands = std::move(args);
      e->operands.push_back(std::move(t));
    }
    return e;
  }

  // `expr` or a slice `start:stop:step` with any part left out.
  absl::StatusOr<ExprPtr> ParseSubscribed() {
    const int line = Cur().line;
    ExprPtr parts[3];
    if (IsOp(":")) {
      Next();
    } else {
      ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
      if (!IsOp(":")) return e;
      Next();
      parts[0] = std::move(e);
    }
    if (!IsOp(":") && !IsOp("]") && !IsOp(",")) {
      ASSIGN_OR_RETURN(parts[1], ParseExpression(true));
    }
    if (SkipOp(":")) {
      if (!IsOp("]") && !IsOp(",")) {
        ASSIGN_OR_RETURN(parts[2], ParseExpression(true));
      }
    }
    ExprPtr s = NewExpr(Expr::Kind::kSlice, line);
    for (ExprPtr& p : parts) s->operands.push_back(std::move(p));
    return s;
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr node) {
    ExprPtr e = NewExpr(Expr::Kind::kCall, Cur().line);
    e->operands.push_back(std::move(node));
    RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return e;
  }

  absl::Status ParseCallArgs(Expr* target) {
    RETURN_IF_ERROR(ExpectOp("("));
    bool require_comma = false;
    while (!IsOp(")")) {
      if (require_comma) {
        RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      if (IsOp("*") || IsOp("**")) {
        return absl::UnimplementedError(
            absl::StrCat("unsupported call syntax \"", Cur().value,
                         "args\" (line ", Cur().line, ")"));
      }
      if (Cur().type == TokenType::kName &&
          Look().type == TokenType::kOperator && Look().value == "=") {
        std::string key = Cur().value;
        Next();
        Next();
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        target->kwarg_names.push_back(std::move(key));
        target->operands.push_back(std::move(value));
      } else {
        if (!target->kwarg_names.empty()) {
          return Error("positional argument follows keyword argument");
        }
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        target->operands.push_back(std::move(value));
        ++target->num_args;
      }
      require_comma = true;
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ParseDottedName() {
    ASSIGN_OR_RETURN(std::string name, ExpectNameToken());
    while (SkipOp(".")) {
      ASSIGN_OR_RETURN(std::string part, ExpectNameToken());
      absl::StrAppend(&name, ".", part);
    }
    return name;
  }

  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr node) {
    DepthScope scope(&depth_);
    while (IsOp("|")) {
      RETURN_IF_ERROR(Deeper());
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(std::string name, ParseDottedName());
      if (!IsJinjaFilter(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown filter \"", name, "\" (line ", line, ")"));
      }
      ExprPtr f = NewExpr(Expr::Kind::kFilter, line);
      f->name = std::move(name);
      f->operands.push_back(std::move(node));
      if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(f.get()));
      node = std::move(f);
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node) {
    const int line = Cur().line;
    Next();  // is
    const bool negated = SkipName("not");
    ASSIGN_OR_RETURN(std::string name, ParseDottedName());
    if (!IsJinjaTest(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown test \"", name, "\" (line ", line, ")"));
    }
    ExprPtr t = NewExpr(Expr::Kind::kTest, line);
    t->name = std::move(name);
    t->negated = negated;
    t->operands.push_back(std::move(node));
    if (IsOp("(")) {
      RETURN_IF_ERROR(ParseCallArgs(t.get()));
    } else if ((Cur().type == TokenType::kName && !IsName("else") &&
                !IsName("or") && !IsName("and")) ||
               Cur().type == TokenType::kString ||
               Cur().type == TokenType::kInteger ||
               Cur().type == TokenType::kFloat || IsOp("[") || IsOp("{")) {
      // `x is divisibleby 3`: one argument without parentheses.
      if (IsName("is")) return Error("you cannot chain multiple tests with is");
      ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      t->operands.push_back(std::move(arg));
      t->num_args = 1;
    }
    return t;
  }

  static ExprPtr Binary(Expr::Kind kind, std::string op, ExprPtr left,
                        ExprPtr right, int line) {
    ExprPtr e = NewExpr(kind, line);
    e->name = std::move(op);
    e->operands.push_back(std::move(left));
    e->operands.push_back(std::move(right));
    return e;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<StmtList> Parse(absl::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens)).ParseTemplate();
}

}  // namespace jinja
}  // namespace tessera
