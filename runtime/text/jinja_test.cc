// Tests of the Jinja engine against Jinja2's semantics in transformers'
// environment (trim_blocks, lstrip_blocks, loopcontrols, tojson without HTML
// escaping).
//
// Every expected string below is what jinja2 3.1 renders for the same
// template and variables in that environment (checked with Python's jinja2
// when the tests were written), so a failure here is a divergence from
// transformers' apply_chat_template.
#include "runtime/text/jinja.h"

#include <ctime>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace jinja {
namespace {

using ::nlohmann::ordered_json;

ordered_json Json(const char* text) { return ordered_json::parse(text); }

absl::StatusOr<std::string> TryRender(
    const std::string& source,
    const ordered_json& vars = ordered_json::object(),
    const RenderOptions& options = {}) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(vars, options);
}

// The rendered text, or "ERROR: <status>" so that a failure shows why.
std::string Render(const std::string& source,
                   const ordered_json& vars = ordered_json::object()) {
  absl::StatusOr<std::string> out = TryRender(source, vars);
  if (!out.ok()) return absl::StrCat("ERROR: ", out.status().ToString());
  return *out;
}

// {{ }} prints str(value): Python's spellings of None/True/False, float repr,
// container repr with quoted strings.
TEST(JinjaOutputTest, PrintsPythonStrOfValues) {
  EXPECT_EQ(Render("{{ 42 }}|{{ -7 }}|{{ 1.0 }}|{{ 2.5 }}|{{ 0.1 + 0.2 }}|{{ "
                   "1e16 }}|{{ 1e15 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ 1/3 }}"),
            "42|-7|1.0|2.5|0.30000000000000004|1e+16|1000000000000000.0|1e-05|"
            "0.0001|0.3333333333333333");
  EXPECT_EQ(Render("{{ none }}|{{ None }}|{{ true }}|{{ False }}"),
            "None|None|True|False");
  EXPECT_EQ(Render("{{ [1, 'a', none, 2.5, true] }}|{{ {'a': 1, 'b': [2]} "
                   "}}|{{ (1, 2) }}|{{ (1,) }}|{{ [] }}|{{ {} }}"),
            "[1, 'a', None, 2.5, True]|{'a': 1, 'b': [2]}|(1, 2)|(1,)|[]|{}");
  EXPECT_EQ(
      Render("{{ [\"it's\"] }}|{{ ['say \"hi\"'] }}|{{ ['both \\' and \"'] "
             "}}|{{ ['tab\\tnew\\nline\\\\'] }}|{{ ['é', '\\x01'] }}"),
      "[\"it's\"]|['say \"hi\"']|['both \\' and "
      "\"']|['tab\\tnew\\nline\\\\']|['é', '\\x01']");
  EXPECT_EQ(
      Render(
          "{{ text }}|{{ number }}|{{ nested }}",
          Json(
              R"json({"text": "héllo", "number": 3.0, "nested": {"k": [null, true, 1.5, "x"]}})json")),
      "héllo|3.0|{'k': [None, True, 1.5, 'x']}");
}

// A missing variable, attribute or index is Undefined: it prints as the empty
// string.
TEST(JinjaOutputTest, UndefinedPrintsNothing) {
  EXPECT_EQ(Render("[{{ missing }}][{{ d.nope }}][{{ d['nope'] }}][{{ l[9] "
                   "}}][{{ 'abc'.nope }}]",
                   Json(R"json({"d": {"a": 1}, "l": [1]})json")),
            "[][][][][]");
}

// String literals use Python escapes; adjacent literals concatenate.
TEST(JinjaOutputTest, StringLiterals) {
  EXPECT_EQ(
      Render("{{ 'a\\nb' }}|{{ \"tab\\there\" }}|{{ '\\u00e9\\x41\\101' }}|{{ "
             "'back\\\\slash' }}|{{ 'keep\\d' }}|{{ 'con' \"cat\" }}"),
      "a\nb|tab\there|éAA|back\\slash|keep\\d|concat");
  EXPECT_EQ(Render("{{ 1_000 }}|{{ 0x1F }}|{{ 0b101 }}|{{ 0o17 }}|{{ 1.5e3 "
                   "}}|{{ 1e2 }}"),
            "1000|31|5|15|1500.0|100.0");
}

// trim_blocks: the newline right after %} or #} goes; not after }}.
TEST(JinjaWhitespaceTest, TrimBlocksDropsOneNewlineAfterBlockAndCommentTags) {
  EXPECT_EQ(Render("a\n{% if true %}\nb\n{% endif %}\nc"), "a\nb\nc");
  EXPECT_EQ(Render("{{ 'x' }}\ny"), "x\ny");
  EXPECT_EQ(Render("{# note #}\nA\n{# two #}\n\nB"), "A\n\nB");
  EXPECT_EQ(Render("{% if true %}\n\n\nx{% endif %}"), "\n\nx");
}

// lstrip_blocks: spaces/tabs from the line start to {% or {# go; text before
// the tag on the same line keeps them; {{ is never stripped.
TEST(JinjaWhitespaceTest, LstripBlocksDropsIndentBeforeBlockTags) {
  EXPECT_EQ(Render("a\n    {% if true %}\n    b\n    {% endif %}\nc"),
            "a\n    b\nc");
  EXPECT_EQ(Render("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(Render("a  {% if true %}b{% endif %}  c"), "a  b  c");
  EXPECT_EQ(Render("  {{ 'v' }}\n\t{{ 'w' }}"), "  v\n\tw");
  EXPECT_EQ(Render("\t  {# c #}\nz"), "z");
  EXPECT_EQ(Render("{{ 'x' }}  {% if true %}y{% endif %}"), "x  y");
}

// {%- / {{- / {#- strip all whitespace before; -%} / -}} / -#} all after.
TEST(JinjaWhitespaceTest, MinusStripsAllWhitespaceIncludingNewlines) {
  EXPECT_EQ(
      Render("a  \n\n  {%- if true -%}  \n\n  b  \n  {%- endif -%}\n\n  c"),
      "abc");
  EXPECT_EQ(Render("x \n {{- 'y' -}} \n z"), "xyz");
  EXPECT_EQ(Render("p \n {#- gone -#} \n q"), "pq");
  EXPECT_EQ(
      Render(
          "{%- for m in messages %}\n    {{- m.role + ': ' + m.content }}\n    "
          "{%- if not loop.last %}\n        {{- '\\n' }}\n    {%- endif "
          "%}\n{%- endfor %}\n",
          Json(
              R"json({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})json")),
      "system: Be brief.\nuser: Hi\nassistant: Hello!\nuser: Bye");
}

// {%+ keeps the indentation before a tag; +%} keeps the newline after it.
TEST(JinjaWhitespaceTest, PlusDisablesTrimAndLstrip) {
  EXPECT_EQ(Render("a\n  {%+ if true %}b{% endif +%}\nc"), "a\n  b\nc");
}

// After a tag that ate its newline, the next line's indentation before a block
// tag counts as a line start.
TEST(JinjaWhitespaceTest, LineStartAfterTagThatConsumedNewline) {
  EXPECT_EQ(Render("{% if true %}\n    {% if true %}x{% endif %}\n{% endif %}"),
            "x");
  EXPECT_EQ(Render("{% for i in [1, 2] %}\n  - {{ i }}\n{% endfor %}\nend"),
            "  - 1\n  - 2\nend");
  EXPECT_EQ(Render("{{ 'a' }}\n  {% if true %}b{% endif %}"), "a\nb");
}

// \r\n and \r become \n, and one trailing newline of the template is dropped
// (keep_trailing_newline=False).
TEST(JinjaWhitespaceTest, NewlinesNormalizedAndFinalNewlineDropped) {
  EXPECT_EQ(Render("a\r\nb\rc\r\n"), "a\nb\nc");
  EXPECT_EQ(Render("one\n"), "one");
  EXPECT_EQ(Render("two\n\n"), "two\n");
}

// {% raw %} copies its body verbatim.
TEST(JinjaWhitespaceTest, RawBlocksAreLiteral) {
  EXPECT_EQ(Render("{% raw %}{{ not rendered }} {% if %}{% endraw %}"),
            "{{ not rendered }} {% if %}");
  EXPECT_EQ(Render("a\n  {% raw %}\n  {{ x }}\n  {% endraw %}\nb"),
            "a\n\n  {{ x }}\nb");
}

// Python semantics: true division, floor division and modulo round toward
// negative infinity, int/float mixing, ** is left-associative in Jinja.
TEST(JinjaOperatorTest, ArithmeticFollowsPython) {
  EXPECT_EQ(Render("{{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % "
                   "3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7.5 % 2 }} {{ -7.5 // 2 "
                   "}} {{ 5 // 2.0 }}"),
            "3.5 2.0 3 -4 1 2 -2 1.5 -4.0 2.0");
  EXPECT_EQ(Render("{{ 1 + 2 }} {{ 1 + 2.0 }} {{ 3 * 1.1 }} {{ 2 ** 10 }} {{ 2 "
                   "** 3 ** 2 }} {{ 2 ** -2 }} {{ true + true }} {{ -x }} {{ "
                   "+x }} {{ - 2 ** 2 }}",
                   Json(R"json({"x": 5})json")),
            "3 3.0 3.3000000000000003 1024 64 0.25 2 -5 5 4");
  EXPECT_EQ(
      Render("{{ 'ab' * 3 }} {{ 2 * 'xy' }} {{ [0] * 3 }} {{ 'a' + 'b' }} {{ "
             "[1] + [2, 3] }} {{ 'n=' ~ 1 ~ none ~ true ~ missing ~ [1] }}"),
      "ababab xyxy [0, 0, 0] ab [1, 2, 3] n=1NoneTrue[1]");
}

// == compares numbers across int/float/bool; comparisons chain; in works on
// strings, lists and dict keys.
TEST(JinjaOperatorTest, ComparisonsAndMembership) {
  EXPECT_EQ(Render("{{ 1 == 1.0 }} {{ true == 1 }} {{ '1' == 1 }} {{ [1, 2] == "
                   "[1, 2.0] }} {{ (1, 2) == [1, 2] }} {{ none == none }} {{ "
                   "missing == missing }}"),
            "True True False True False True True");
  EXPECT_EQ(Render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] "
                   "< [1, 3] }} {{ 2 >= 2.0 }} {{ 1 != 2 }}"),
            "True False True True True True");
  EXPECT_EQ(Render("{{ 'at' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ "
                   "'v' in d }} {{ 'z' not in d }} {{ 1 in missing }}",
                   Json(R"json({"d": {"k": "v"}})json")),
            "True True True False True False");
}

// and/or return an operand, as in Python; not binds looser than comparisons.
TEST(JinjaOperatorTest, LogicReturnsOperands) {
  EXPECT_EQ(Render("[{{ 'a' and 'b' }}][{{ 0 and 'b' }}][{{ '' or 'default' "
                   "}}][{{ 'x' or 'y' }}][{{ none or missing }}][{{ not 0 "
                   "}}][{{ not 1 == 2 }}][{{ not missing }}]"),
            "[b][0][default][x][][True][True][True]");
}

// x if c else y; without else, a false condition gives Undefined.
TEST(JinjaOperatorTest, ConditionalExpressions) {
  EXPECT_EQ(Render("{{ 'yes' if 1 else 'no' }}|{{ 'yes' if 0 else 'no' }}|{{ "
                   "'a' if 0 else 'b' if 1 else 'c' }}|{{ 'only' if 0 }}|"),
            "yes|no|b||");
}

// Jinja applies a filter to the whole unary expression: -3|abs is abs(-3); ~
// and + bind to filtered operands.
TEST(JinjaOperatorTest, FilterBindsTighterThanUnaryMinus) {
  EXPECT_EQ(Render("{{ -3|abs }} {{ -(3|abs) }} {{ 'ab' ~ 'cd'|upper }} {{ [1, "
                   "2]|length + 1 }}"),
            "3 -3 abCD 3");
}

// a.b looks up the item when there is no attribute; negative indices and slices
// follow Python, counting code points.
TEST(JinjaAccessTest, AttributesItemsAndSlices) {
  EXPECT_EQ(
      Render(
          "{{ d.a }} {{ d['a'] }} {{ d.n.m }} {{ l[0] }} {{ l[-1] }} {{ l.1 }} "
          "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-100:2] }}",
          Json(R"json({"d": {"a": 1, "n": {"m": 2}}, "l": [1, 2, 3]})json")),
      "1 1 2 1 3 2 [2, 3] [1, 2] [3, 2, 1] [1, 3] [1, 2]");
  EXPECT_EQ(Render("{{ s[0] }} {{ s[-1] }} {{ s[1:3] }} {{ s[::-1] }} {{ "
                   "s[10:] }}|{{ u[1] }} {{ u[::-1] }} {{ u[:2] }}",
                   Json(R"json({"s": "Hello", "u": "héllo"})json")),
            "H o el olleH |é olléh hé");
  EXPECT_EQ(
      Render(
          "{{ messages[0].role }} {{ messages[-1]['content'] }} {{ "
          "(messages|selectattr('role', 'equalto', 'user')|list)[-1].content "
          "}}",
          Json(
              R"json({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})json")),
      "system Bye Bye");
}

// Attribute access finds dict methods first (d.items is the method), then keys;
// d['items'] finds the key.
TEST(JinjaAccessTest, DictMethodsShadowKeys) {
  EXPECT_EQ(
      Render(
          "{{ d.items() }} {{ d.keys()|list }} {{ d.values()|list }} {{ "
          "d.get('a') }} {{ d.get('q') }} {{ d.get('q', 7) }} {{ d['items'] }}",
          Json(R"json({"d": {"a": 1, "items": "key"}})json")),
      "dict_items([('a', 1), ('items', 'key')]) ['a', 'items'] [1, 'key'] 1 "
      "None 7 key");
}

TEST(JinjaStatementTest, IfElifElse) {
  EXPECT_EQ(
      Render("{% if x > 5 %}big{% elif x > 2 %}mid{% else %}small{% endif %}",
             Json(R"json({"x": 3})json")),
      "mid");
  EXPECT_EQ(Render("{% if missing %}a{% elif none %}b{% else %}c{% endif %}"),
            "c");
}

// loop.index, index0, revindex, revindex0, first, last, length, previtem,
// nextitem, cycle.
TEST(JinjaStatementTest, ForLoopVariables) {
  EXPECT_EQ(
      Render(
          "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ "
          "loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last "
          "}}{{ loop.length }}|{% endfor %}",
          Json(
              R"json({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})json")),
      "1043TrueFalse4|2132FalseFalse4|3221FalseFalse4|4310FalseTrue4|");
  EXPECT_EQ(
      Render(
          "{% for m in messages %}{{ loop.previtem.role if loop.previtem is "
          "defined else '^' }}>{{ loop.nextitem.role if loop.nextitem is "
          "defined else '$' }} {% endfor %}",
          Json(
              R"json({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})json")),
      "^>user system>assistant user>user assistant>$ ");
  EXPECT_EQ(
      Render(
          "{% for i in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}"),
      "abcab");
  EXPECT_EQ(
      Render(
          "{% for i in [1, 1, 2, 2, 1] %}{{ loop.changed(i) }} {% endfor %}"),
      "True False True False True ");
}

// Lists, dict keys, dict items with tuple unpacking, strings, ranges, Undefined
// (nothing).
TEST(JinjaStatementTest, ForLoopIterables) {
  EXPECT_EQ(
      Render(
          "{% for k in d %}{{ k }}{% endfor %}|{% for k, v in d.items() %}{{ k "
          "}}={{ v }};{% endfor %}|{% for c in 'abc' %}{{ c }}.{% endfor %}|{% "
          "for i in range(3) %}{{ i }}{% endfor %}|{% for i in range(1, 10, 3) "
          "%}{{ i }}{% endfor %}|{% for i in range(3, 0, -1) %}{{ i }}{% "
          "endfor %}|{% for x in missing %}never{% endfor %}",
          Json(R"json({"d": {"b": 1, "a": 2}})json")),
      "ba|b=1;a=2;|a.b.c.|012|147|321|");
  EXPECT_EQ(
      Render("{% for a, b in [[1, 2], [3, 4]] %}{{ a * b }} {% endfor %}"),
      "2 12 ");
}

// `for x in y if cond` filters before counting; else runs when no iteration ran
// its body to the end.
TEST(JinjaStatementTest, ForLoopFilterAndElse) {
  EXPECT_EQ(
      Render(
          "{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ "
          "loop.length }}:{{ m.role }} {% endfor %}",
          Json(
              R"json({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})json")),
      "1/3:user 2/3:assistant 3/3:user ");
  EXPECT_EQ(Render("{% for i in [] %}x{% else %}empty{% endfor %}|{% for i in "
                   "[1] %}{{ i }}{% else %}empty{% endfor %}"),
            "empty|1");
  EXPECT_EQ(Render("{% for i in [1, 2] %}{% continue %}{% else %}else-ran{% "
                   "endfor %}|{% for i in [1, 2] %}{% if i == 2 %}{% break "
                   "%}{% endif %}{% else %}else-ran{% endfor %}"),
            "else-ran|");
}

TEST(JinjaStatementTest, BreakAndContinue) {
  EXPECT_EQ(
      Render("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif "
             "%}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
      "0134");
}

// Assignments inside a loop body are local to that iteration; namespace()
// objects carry state out.
TEST(JinjaStatementTest, LoopScopeDoesNotLeak) {
  EXPECT_EQ(Render("{% set x = 0 %}{% for i in range(3) %}{% set x = x + 1 "
                   "%}{{ x }}{% endfor %}{{ x }}"),
            "1110");
  EXPECT_EQ(Render("{% for i in range(3) %}{% if i == 0 %}{% set y = 7 %}{% "
                   "endif %}[{{ y }}]{% endfor %}"),
            "[7][][]");
  EXPECT_EQ(
      Render(
          "{% set ns = namespace(total=0, found=false) %}{% for i in range(4) "
          "%}{% set ns.total = ns.total + i %}{% if i == 2 %}{% set ns.found = "
          "true %}{% endif %}{% endfor %}{{ ns.total }} {{ ns.found }}"),
      "6 True");
  EXPECT_EQ(Render("{% if true %}{% set z = 1 %}{% endif %}{{ z }}"), "1");
}

// Plain, tuple-unpacking, namespace attribute and block assignment.
TEST(JinjaStatementTest, SetForms) {
  EXPECT_EQ(Render("{% set a = 1 %}{% set b, c = [2, 3] %}{% set t = 4, 5 %}{{ "
                   "a }}{{ b }}{{ c }}{{ t }}"),
            "123(4, 5)");
  EXPECT_EQ(Render("{% set ns = namespace() %}{% set ns.index = 0 %}{% set "
                   "ns.index = ns.index + 1 %}{{ ns.index }}"),
            "1");
  EXPECT_EQ(Render("{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]"),
            "[inner 2]");
  EXPECT_EQ(
      Render(
          "{% set messages = messages[1:] %}{{ messages|length }}",
          Json(
              R"json({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})json")),
      "3");
}

// Defaults, keyword arguments, recursion; a macro sees the template's variables
// at call time, not the caller's loop variables.
TEST(JinjaStatementTest, Macros) {
  EXPECT_EQ(Render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct "
                   "}}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', '?') }} "
                   "{{ greet(punct='.', name='Zed') }}"),
            "Hi Bob! Hi Al? Hi Zed.");
  EXPECT_EQ(Render("{% macro count(n) %}{% if n > 0 %}{{ n }}{{ count(n - 1) "
                   "}}{% endif %}{% endmacro %}{{ count(3) }}"),
            "321");
  EXPECT_EQ(Render("{% set g = 1 %}{% macro show() %}{{ g }}{% endmacro %}{{ "
                   "show() }}{% set g = 2 %}{{ show() }}"),
            "12");
  EXPECT_EQ(Render("{% set y = 'outer' %}{% macro m() %}{{ y }}{% endmacro "
                   "%}{% for y in ['loop'] %}{{ m() }}{% endfor %}"),
            "outer");
  EXPECT_EQ(Render("{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}"), "[]");
}

// transformers' {% generation %} marks assistant text and renders its body.
TEST(JinjaStatementTest, GenerationBlockRendersBody) {
  EXPECT_EQ(Render("<{% generation %}text {{ 1 }}{% endgeneration %}>"),
            "<text 1>");
}

TEST(JinjaFilterTest, StringFilters) {
  EXPECT_EQ(
      Render("{{ 'Hello World'|lower }}|{{ 'hi'|upper }}|{{ \"they're here-now "
             "(ok)\"|title }}|{{ 'hELLO wORLD'|capitalize }}|{{ 'straße'|upper "
             "}}|{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}"),
      "hello world|HI|They're Here-Now (Ok)|Hello world|STRASSE|x|hi");
  EXPECT_EQ(Render("{{ 'a-b-c'|replace('-', '+') }}|{{ 'aaa'|replace('a', 'b', "
                   "2) }}|{{ 3|string }}|{{ [1]|string }}|{{ none|string }}|{{ "
                   "'abc'|center(9) }}|{{ 'a b  c'|wordcount }}"),
            "a+b+c|bba|3|[1]|None|   abc   |3");
  EXPECT_EQ(Render("{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) "
                   "}}|{{ 'a\\n\\nb'|indent(width='> ', blank=true) }}"),
            "a\n  b\n\n  c|  a\n  b|a\n> \n> b");
  EXPECT_EQ(Render("{{ '<a href=\"x\">'|e }}|{{ 'x'|safe }}|{{ 'x'|safe + "
                   "'<b>' }}|{{ ('x'|safe) ~ '<b>' }}"),
            "&lt;a href=&#34;x&#34;&gt;|x|x&lt;b&gt;|x<b>");
}

TEST(JinjaFilterTest, SequenceFilters) {
  EXPECT_EQ(
      Render("{{ l|length }} {{ l|count }} {{ s|length }} {{ d|length }} {{ "
             "missing|length }} {{ l|first }} {{ l|last }} {{ s|first }} {{ "
             "d|first }} {{ []|first }}|",
             Json(R"json({"l": [3, 1, 2], "s": "héllo", "d": {"a": 1}})json")),
      "3 3 5 1 0 3 2 h a |");
  EXPECT_EQ(Render("{{ l|join(', ') }} {{ l|join }} {{ l|list }} {{ 'ab'|list "
                   "}} {{ l|reverse|list }} {{ 'abc'|reverse }} {{ l|sort }} "
                   "{{ l|sort(reverse=true) }} {{ ['b', 'A', 'c']|sort }} {{ "
                   "['b', 'A', 'c']|sort(case_sensitive=true) }}",
                   Json(R"json({"l": [3, 1, 2]})json")),
            "3, 1, 2 312 [3, 1, 2] ['a', 'b'] [2, 1, 3] cba [1, 2, 3] [3, 2, "
            "1] ['A', 'b', 'c'] ['A', 'b', 'c']");
  EXPECT_EQ(
      Render("{{ [1, 2, 1, 3]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} "
             "{{ [3, 1]|max }} {{ [3, 1]|min }} {{ [1, 2, 3]|sum }} {{ "
             "d|dictsort }} {{ d|items|list }}",
             Json(R"json({"d": {"b": 1, "a": 2}})json")),
      "[1, 2, 3] ['a', 'b'] 3 1 6 [('a', 2), ('b', 1)] [('b', 1), ('a', 2)]");
}

TEST(JinjaFilterTest, SelectMapAndAttributeFilters) {
  EXPECT_EQ(
      Render(
          "{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ "
          "messages|rejectattr('role', 'equalto', "
          "'user')|map(attribute='role')|list }} {{ "
          "messages|map(attribute='role')|join(',') }} {{ "
          "messages|map(attribute='name', default='-')|join }}",
          Json(
              R"json({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})json")),
      "2 ['system', 'assistant'] system,user,assistant,user ----");
  EXPECT_EQ(
      Render("{{ [0, 1, 2, '', none]|select|list }} {{ [1, 2, 3, "
             "4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('even')|list }} "
             "{{ [1, 2, 3]|select('gt', 1)|list }} {{ ['A', "
             "'b']|map('lower')|join }} {{ [1, 2]|map('string')|list }}"),
      "[1, 2] [1, 3] [1, 3] [2, 3] ab ['1', '2']");
  EXPECT_EQ(
      Render(
          "{{ messages|sort(attribute='role')|map(attribute='content')|list }} "
          "{{ builtin|reject('equalto', 'code_interpreter')|join(', ') }}",
          Json(
              R"json({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}], "builtin": ["brave_search", "code_interpreter", "wolfram_alpha"]})json")),
      "['Hello!', 'Be brief.', 'Hi', 'Bye'] brave_search, wolfram_alpha");
}

TEST(JinjaFilterTest, NumberFilters) {
  EXPECT_EQ(Render("{{ '42'|int }} {{ ' 7 '|int }} {{ '4.7'|int }} {{ 'x'|int "
                   "}} {{ 'x'|int(9) }} {{ 3.9|int }} {{ true|int }} {{ "
                   "'2.5'|float }} {{ 'x'|float }} {{ 4|float }} {{ -3|abs }} "
                   "{{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ "
                   "7|round }} {{ 2.1|round(0, 'ceil') }}"),
            "42 7 4 0 9 3 1 2.5 0.0 4.0 3 2.57 2.0 4.0 7 3.0");
}

// default replaces Undefined (and with boolean=true, any false value).
TEST(JinjaFilterTest, DefaultFilter) {
  EXPECT_EQ(
      Render(
          "{{ missing|default('d') }} {{ ''|default('d') }} {{ ''|default('d', "
          "true) }} {{ none|d('x') }} {{ 0|d(5, boolean=true) }}"),
      "d  d None 5");
}

// transformers' tojson: json.dumps(x, ensure_ascii=False) keeping key order;
// indent switches the item separator to ','.
TEST(JinjaFilterTest, TojsonIsPythonJsonDumps) {
  EXPECT_EQ(Render("{{ d|tojson }}|{{ [1, 'é', none, true, 1.0]|tojson }}|{{ "
                   "'q\"\\\\\\n\\t\\u0001'|tojson }}|{{ "
                   "d|tojson(sort_keys=true) }}|{{ {}|tojson(indent=2) }}",
                   Json(R"json({"d": {"b": 1, "a": [1, {"z": null}]}})json")),
            "{\"b\": 1, \"a\": [1, {\"z\": null}]}|[1, \"é\", null, true, "
            "1.0]|\"q\\\"\\\\\\n\\t\\u0001\"|{\"a\": [1, {\"z\": null}], "
            "\"b\": 1}|{}");
  EXPECT_EQ(
      Render(
          "{{ d|tojson(indent=2) }}",
          Json(R"json({"d": {"b": 1, "a": [1, {"z": null}], "e": []}})json")),
      "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    {\n      \"z\": null\n    }\n  "
      "],\n  \"e\": []\n}");
  EXPECT_EQ(Render("{{ d|tojson(separators=(',', ':')) }}|{{ "
                   "'ü'|tojson(ensure_ascii=true) }}|{{ [1, "
                   "[2]]|tojson(indent=0) }}|{{ {1: 'a', none: 'b'}|tojson }}",
                   Json(R"json({"d": {"a": 1, "b": [2]}})json")),
            "{\"a\":1,\"b\":[2]}|\"\\u00fc\"|[\n1,\n[\n2\n]\n]|{\"1\": \"a\", "
            "\"null\": \"b\"}");
}

// The `is` tests.
TEST(JinjaTestTest, Tests) {
  EXPECT_EQ(Render("{{ x is defined }} {{ missing is defined }} {{ missing is "
                   "undefined }} {{ n is none }} {{ x is not none }} {{ x is "
                   "number }} {{ f is float }} {{ x is integer }} {{ t is "
                   "boolean }} {{ t is true }} {{ t is false }}",
                   Json(R"json({"x": 5, "f": 1.5, "n": null, "t": true})json")),
            "True False True True True True True True True True False");
  EXPECT_EQ(
      Render("{{ s is string }} {{ d is mapping }} {{ l is iterable }} {{ l is "
             "sequence }} {{ s is sequence }} {{ x is iterable }} {{ missing "
             "is iterable }} {{ s is lower }} {{ 'ABC' is upper }}",
             Json(R"json({"x": 5, "s": "abc", "d": {}, "l": []})json")),
      "True True True True True False True True True");
  EXPECT_EQ(Render("{{ x is odd }} {{ x is even }} {{ x is divisibleby 5 }} {{ "
                   "x is divisibleby(3) }} {{ x is eq 5 }} {{ x is equalto 5 "
                   "}} {{ x is ne 5 }} {{ x is gt 4 }} {{ x is le 4 }} {{ 'a' "
                   "is in 'cat' }} {{ none is sameas none }}",
                   Json(R"json({"x": 5})json")),
            "True False True False True True False True False True True");
}

// Python str methods as templates call them.
TEST(JinjaMethodTest, StringMethods) {
  EXPECT_EQ(Render("[{{ '  a b  '.strip() }}][{{ 'xxaxx'.lstrip('x') }}][{{ "
                   "'xxaxx'.rstrip('x') }}][{{ '\\n\\nx\\n'.strip('\\n') }}]"),
            "[a b][axx][xxa][x]");
  EXPECT_EQ(
      Render(
          "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ "
          "'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ "
          "'x</think>y'.split('</think>')[-1] }} {{ 'a\\nb'.splitlines() }}"),
      "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b,c'] ['a,b', 'c'] y ['a', 'b']");
  EXPECT_EQ(Render("{{ s.startswith('He') }} {{ s.endswith('lo') }} {{ "
                   "s.startswith(('x', 'H')) }} {{ s.upper() }} {{ s.lower() "
                   "}} {{ s.replace('l', 'L') }} {{ s.find('l') }} {{ "
                   "s.rfind('l') }} {{ s.find('z') }} {{ s.count('l') }}",
                   Json(R"json({"s": "Hello"})json")),
            "True True True HELLO hello HeLLo 2 3 -1 2");
  EXPECT_EQ(Render("{{ 'hello world'.title() }} {{ \"they're\".title() }} {{ "
                   "'hELLO'.capitalize() }} {{ '-'.join(['a', 'b']) }} {{ '{} "
                   "and {}'.format('x', 1) }} {{ '{0}{name}'.format('a', "
                   "name='b') }} {{ '123'.isdigit() }} {{ "
                   "'abc'.removeprefix('a') }} {{ '7'.zfill(3) }}"),
            "Hello World They'Re Hello a-b x and 1 ab True bc 007");
}

// Read-only list methods work; mutating ones are undefined in the immutable
// sandbox.
TEST(JinjaMethodTest, ListMethodsAndUnsafeAttributes) {
  EXPECT_EQ(Render("{{ l.index(2) }} {{ l.count(1) }} {{ l.append is defined "
                   "}} {{ d.update is defined }}",
                   Json(R"json({"l": [1, 2], "d": {}})json")),
            "1 1 False False");
}

// range, namespace, dict.
TEST(JinjaGlobalTest, Globals) {
  EXPECT_EQ(Render("{{ range(3)|list }} {{ namespace(a=1).a }} {{ dict(a=1, "
                   "b=2) }} {{ namespace({'k': 'v'}).k }}"),
            "[0, 1, 2] 1 {'a': 1, 'b': 2} v");
}
// --- Errors
// -------------------------------------------------------------------

TEST(JinjaErrorTest, RaiseExceptionCarriesTheMessage) {
  absl::StatusOr<std::string> out = TryRender(
      "{% if messages|length == 0 %}"
      "{{ raise_exception('Conversation roles must alternate') }}"
      "{% endif %}",
      Json(R"json({"messages": []})json"));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "Conversation roles must alternate");
  EXPECT_TRUE(IsTemplateException(out.status()));
}

TEST(JinjaErrorTest, UnsupportedJinjaFeaturesAreNamed) {
  absl::StatusOr<std::string> out =
      TryRender("line 1\n{{ 'a b'|wordwrap(1) }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(out.status().message(), "unsupported filter \"wordwrap\" (line 2)");
  EXPECT_FALSE(IsTemplateException(out.status()));

  out = TryRender("{% include 'other.jinja' %}");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(out.status().message(),
            "unsupported statement \"include\" (line 1)");

  out = TryRender("{{ 'abc'.encode() }}");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(out.status().message(),
            "unsupported method \"str.encode\" (line 1)");

  out = TryRender("{{ cycler('a') }}");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(out.status().message(), "unsupported function \"cycler\" (line 1)");
}

TEST(JinjaErrorTest, UnknownFiltersAndTestsFailAtParseEvenInDeadBranches) {
  // Jinja rejects names it does not know when it compiles the template.
  absl::StatusOr<Template> t =
      Template::Parse("{% if false %}\n\n{{ x|frobnicate }}{% endif %}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), "unknown filter \"frobnicate\" (line 3)");

  t = Template::Parse("{% if x is frobbed %}{% endif %}");
  EXPECT_EQ(t.status().message(), "unknown test \"frobbed\" (line 1)");

  // `do` needs an extension transformers does not load.
  t = Template::Parse("{% do x.append(1) %}");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(t.status().message(), "unknown tag \"do\""));
}

TEST(JinjaErrorTest, SyntaxErrors) {
  for (const char* source :
       {"{% if x %}never closed", "{{ x ", "{% for x in %}{% endfor %}",
        "{{ 'unterminated }}", "{# no end", "{% endif %}", "{{ (1, }}",
        "{% break %}", "{{ x | }}", "{% set %}", "{{ 1 + }}",
        "{% macro m(a=1, b) %}{% endmacro %}", "{{ ] }}"}) {
    absl::StatusOr<Template> t = Template::Parse(source);
    EXPECT_FALSE(t.ok()) << source;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << source;
  }
}

TEST(JinjaErrorTest, RuntimeErrorsNameTheLine) {
  absl::StatusOr<std::string> out = TryRender("ok\n{{ missing.attr }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "'missing' is undefined (line 2)");

  // Undefined may be printed and tested, but not used in arithmetic, called
  // or iterated as a mapping.
  for (const char* source :
       {"{{ missing + 1 }}", "{{ missing() }}", "{{ missing['k'] }}",
        "{{ 'a' + 1 }}", "{{ 1 / 0 }}", "{{ 10 // 0 }}", "{{ 'x' < 1 }}",
        "{% for x in none %}{% endfor %}", "{% for a, b in [1] %}{% endfor %}",
        "{{ none|length }}", "{{ {'a': 1}.b.c }}", "{{ [1, 2]|reverse|last }}",
        "{% set d = {} %}{% set d.x = 1 %}", "{{ 'a'.index('z') }}",
        "{{ x|tojson }}"}) {
    out = TryRender(source);
    EXPECT_FALSE(out.ok()) << source;
    EXPECT_TRUE(absl::StrContains(out.status().message(), "(line 1)"))
        << source << ": " << out.status();
  }
}

// --- Limits
// ---------------------------------------------------------------------

TEST(JinjaLimitTest, RunawayTemplatesStop) {
  RenderOptions options;
  options.max_steps = 10000;
  absl::StatusOr<std::string> out = TryRender(
      "{% for i in range(1000) %}{% for j in range(1000) %}"
      "{% endfor %}{% endfor %}",
      ordered_json::object(), options);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);

  out = TryRender("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);

  // The sandbox's MAX_RANGE.
  out = TryRender("{{ range(100001)|length }}");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);

  options = RenderOptions();
  options.max_output_bytes = 1000;
  out = TryRender("{% for i in range(100) %}0123456789ABCDEF{% endfor %}",
                  ordered_json::object(), options);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);

  out = TryRender(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
      "{% set ns.s = ns.s + ns.s %}{% endfor %}");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JinjaLimitTest, DeepNestingIsASyntaxErrorNotACrash) {
  const std::string deep_parens =
      "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  std::string long_chain = "{{ 1";
  for (int i = 0; i < 20000; ++i) long_chain += " + 1";
  long_chain += " }}";
  std::string long_filters = "{{ 'x'";
  for (int i = 0; i < 20000; ++i) long_filters += "|string";
  long_filters += " }}";
  std::string deep_ifs;
  for (int i = 0; i < 5000; ++i) deep_ifs += "{% if true %}";
  auto repeat = [](absl::string_view piece, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) absl::StrAppend(&out, piece);
    return out;
  };
  const std::vector<std::string> more = {
      "{{ " + repeat("-", 20000) + "1 }}",
      "{{ " + repeat("not ", 20000) + "1 }}",
      "{{ x" + repeat(".a", 20000) + " }}",
      "{{ x" + repeat("[0]", 20000) + " }}",
      "{{ f" + repeat("()", 20000) + " }}",
      "{{ " + repeat("[", 20000) + repeat("]", 20000) + " }}",
      "{{ " + repeat("{1: ", 20000) + "1" + repeat("}", 20000) + " }}",
      "{{ " + repeat("1 if 1 else ", 20000) + "1 }}",
      "{{ x" + repeat(" is defined", 20000) + " }}",
      "{{ 2" + repeat(" ** 2", 20000) + " }}",
      repeat("{% for x in y %}", 5000),
      repeat("{% macro m() %}", 5000),
      repeat("{% set x %}", 5000),
      repeat("{% generation %}", 5000),
      "{{ f(" + repeat("f(", 20000) + " }}",
  };
  std::vector<std::string> sources = {deep_parens, long_chain, long_filters,
                                      deep_ifs};
  sources.insert(sources.end(), more.begin(), more.end());
  for (const std::string& source : sources) {
    absl::StatusOr<Template> t = Template::Parse(source);
    ASSERT_FALSE(t.ok()) << source.substr(0, 40);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument)
        << source.substr(0, 40) << ": " << t.status();
  }
}

TEST(JinjaGlobalTest, StrftimeNowUsesTheClock) {
  RenderOptions options;
  // Noon UTC on 26 July 2024: the same date in any time zone within 11 hours.
  options.clock = [] { return static_cast<std::time_t>(1721995200); };
  absl::StatusOr<std::string> out = TryRender("{{ strftime_now('%d %b %Y') }}",
                                              ordered_json::object(), options);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "26 Jul 2024");
}

TEST(JinjaRenderTest, VariablesMustBeAnObject) {
  absl::StatusOr<Template> t = Template::Parse("{{ x }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Render(Json("[1]")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Nested arrays/objects `depth` levels deep around 1, parsed (nlohmann's
// parser and destructor do not recurse).
ordered_json Nested(int depth) {
  std::string text(static_cast<size_t>(depth), '[');
  text += "1";
  text.append(static_cast<size_t>(depth), ']');
  return ordered_json::parse(text);
}

TEST(JinjaLimitTest, DeeplyNestedVariablesAreAnErrorNotACrash) {
  ordered_json vars = ordered_json::object();
  vars["x"] = Nested(20000);
  absl::StatusOr<std::string> out = TryRender("{{ x }}", vars);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(out.status().message(),
                                "JSON nested deeper than 64 levels"))
      << out.status();
  EXPECT_TRUE(absl::StrContains(out.status().message(), "\"x\""));

  // The limit itself is fine.
  vars["x"] = Nested(64);
  out = TryRender("{{ x|tojson|length }}", vars);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "129");
  vars["x"] = Nested(65);
  EXPECT_EQ(TryRender("{{ 1 }}", vars).status().code(),
            absl::StatusCode::kInvalidArgument);

  EXPECT_TRUE(CheckJsonDepth(Nested(64), 64).ok());
  EXPECT_EQ(CheckJsonDepth(Nested(20000), 64).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckJsonDepth(Json(R"({"a": [{"b": 1}], "c": [[]]})"), 3).ok());
  EXPECT_FALSE(
      CheckJsonDepth(Json(R"({"a": [{"b": 1}], "c": [[[]]]})"), 3).ok());
  EXPECT_TRUE(CheckJsonDepth(Json("7"), 0).ok());
}

// A template can nest values as deep as it likes in a loop; every walk over
// them (printing, ==, <, tojson) recurses, so the depth is refused where
// the value is built.
TEST(JinjaLimitTest, DeepValuesBuiltByATemplateAreAnError) {
  for (const char* use :
       {"{{ ns.x }}", "{{ ns.x == ns.x }}", "{{ ns.x|tojson }}",
        "{{ [ns.x] < [ns.x] }}", "{{ ns.x|string|length }}"}) {
    const std::string source = absl::StrCat(
        "{% set ns = namespace(x=none) %}{% for i in range(100000) %}"
        "{% set ns.x = [ns.x] %}{% endfor %}",
        use);
    absl::StatusOr<std::string> out = TryRender(source);
    ASSERT_FALSE(out.ok()) << use;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(out.status().message(),
                                  "nested deeper than 128 levels"))
        << out.status();
  }
  // Wrapping client JSON a few times is fine.
  ordered_json vars = ordered_json::object();
  vars["x"] = Nested(64);
  EXPECT_TRUE(TryRender("{{ [[[x]]]|tojson|length }}", vars).ok());
}

// Namespaces are mutable: a chain of them grows after each is built, and one
// can hold itself.
TEST(JinjaLimitTest, PrintingNamespacesIsBounded) {
  EXPECT_EQ(Render("{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}"),
            "<Namespace {'x': <Namespace {...}>}>");
  EXPECT_EQ(Render("{% set a = namespace(x=1) %}{% set b = namespace(y=a) %}"
                   "{% set a.x = [b] %}{{ a }}"),
            "<Namespace {'x': [<Namespace {'y': <Namespace {...}>}>]}>");
  absl::StatusOr<std::string> out = TryRender(
      "{% set state = namespace(cur=namespace(x=none)) %}"
      "{% set root = state.cur %}"
      "{% for i in range(100000) %}{% set new = namespace(x=none) %}"
      "{% set c = state.cur %}{% set c.x = new %}{% set state.cur = new %}"
      "{% endfor %}{{ root }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(out.status().message(), "nested deeper"))
      << out.status();
  // The same chain, dropped unprinted, is freed without recursing.
  out = TryRender(
      "{% set state = namespace(cur=namespace(x=none)) %}"
      "{% for i in range(100000) %}{% set new = namespace(x=none) %}"
      "{% set c = state.cur %}{% set c.x = new %}{% set state.cur = new %}"
      "{% endfor %}done");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "done");
  // As in Jinja, the loop object is not a namespace.
  out = TryRender("{% for i in [1] %}{% set loop.x = 1 %}{% endfor %}");
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(),
                                "cannot assign attribute on non-namespace"))
      << out.status();
}

// One operation may not build a string past 64 MiB, however it is asked to.
TEST(JinjaLimitTest, HugeStringsAreRefusedBeforeTheyAreBuilt) {
  for (const char* source : {
           "{{ 'x'.center(10**12) }}",
           "{{ 'x'|center(10**12) }}",
           "{{ 'x'.ljust(10**12, '*') }}",
           "{{ 'x'.zfill(10**12) }}",
           "{{ 'a\nb'|indent(10**12) }}",
           "{{ ('x' * 1000000)|replace('', 'y' * 100) }}",
           "{{ ('x' * 1000000).replace('x', 'y' * 100) }}",
           "{{ (['x' * 1000000] * 100)|join }}",
           "{{ ['x' * 1000000] * 100 }}",
           "{{ (['x' * 1000000] * 100)|tojson }}",
           "{{ [[1]]|tojson(indent='x' * 40000000) }}",
           "{{ ('{0}' * 1000).format('x' * 1000000) }}",
           "{{ ('<' * 20000000)|forceescape }}",
           "{{ [0] * 2000000 }}",
       }) {
    absl::StatusOr<std::string> out = TryRender(source);
    ASSERT_FALSE(out.ok()) << source;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument)
        << source << ": " << out.status();
  }
}

}  // namespace
}  // namespace jinja
}  // namespace tessera
