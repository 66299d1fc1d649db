#include "launch/flag_parser.h"

#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace tessera {

void FlagParser::Add(std::string name, std::string* target, std::string help) {
  flags_.push_back({std::move(name), target, std::move(help),
                    absl::StrCat("\"", *target, "\"")});
}
void FlagParser::Add(std::string name, int64_t* target, std::string help) {
  flags_.push_back(
      {std::move(name), target, std::move(help), absl::StrCat(*target)});
}
void FlagParser::Add(std::string name, double* target, std::string help) {
  flags_.push_back(
      {std::move(name), target, std::move(help), absl::StrCat(*target)});
}
void FlagParser::Add(std::string name, bool* target, std::string help) {
  flags_.push_back(
      {std::move(name), target, std::move(help), *target ? "true" : "false"});
}

void FlagParser::Add(std::string name, std::vector<std::string>* target,
                     std::string help) {
  flags_.push_back({std::move(name), target,
                    absl::StrCat(std::move(help), "; repeatable"), "none"});
}

FlagParser::Flag* FlagParser::Find(absl::string_view name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagParser::WasSet(absl::string_view name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.set;
  }
  return false;
}

absl::Status FlagParser::Assign(Flag& flag, absl::string_view value) {
  auto bad = [&](absl::string_view kind) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag.name, ": \"", value, "\" is not ", kind));
  };
  if (auto* s = std::get_if<std::string*>(&flag.target)) {
    **s = std::string(value);
  } else if (auto* i = std::get_if<int64_t*>(&flag.target)) {
    if (!absl::SimpleAtoi(value, *i)) return bad("an integer");
  } else if (auto* d = std::get_if<double*>(&flag.target)) {
    if (!absl::SimpleAtod(value, *d)) return bad("a number");
  } else if (auto* b = std::get_if<bool*>(&flag.target)) {
    if (!absl::SimpleAtob(value, *b)) return bad("true or false");
  } else if (auto* list =
                 std::get_if<std::vector<std::string>*>(&flag.target)) {
    (*list)->emplace_back(value);
  }
  flag.set = true;
  return absl::OkStatus();
}

absl::Status FlagParser::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (!absl::ConsumePrefix(&arg, "--") || arg.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument \"", args[i], "\" for 'tessera ",
                       command_, "'"));
    }
    absl::string_view name = arg;
    std::optional<absl::string_view> value;
    if (const size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    Flag* flag = Find(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name,
                                                     " for 'tessera ", command_,
                                                     "' (see --help)"));
    }
    if (!value.has_value()) {
      if (std::holds_alternative<bool*>(flag->target)) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value"));
      }
    }
    if (absl::Status s = Assign(*flag, *value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string FlagParser::Usage() const {
  std::string out = absl::StrCat("usage: tessera ", command_, " [flags]\n");
  for (const Flag& f : flags_) {
    absl::StrAppendFormat(&out, "  --%-16s %s (default %s)\n", f.name, f.help,
                          f.default_text);
  }
  return out;
}

}  // namespace tessera
