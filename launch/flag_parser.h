// A small command-line flag parser for the `tessera` subcommands.
//
// Why not absl flags: Debian's libsentencepiece.so carries its own copy of
// absl's flag registry under the same symbol names, and linking both makes
// absl::ParseCommandLine hang. Each subcommand also wants its own flag set,
// which a global registry does not give.
//
// Accepted forms: --name=value, --name value, and for booleans --name,
// --name=true|false. Names use dashes (--max-tokens), as the command-line
// contract in DESIGN.md spells them.
#ifndef TESSERA_LAUNCH_FLAG_PARSER_H_
#define TESSERA_LAUNCH_FLAG_PARSER_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {

class FlagParser {
 public:
  explicit FlagParser(std::string command) : command_(std::move(command)) {}

  // Registers a flag bound to `target`, which holds the default and receives
  // the parsed value.
  void Add(std::string name, std::string* target, std::string help);
  void Add(std::string name, int64_t* target, std::string help);
  void Add(std::string name, double* target, std::string help);
  void Add(std::string name, bool* target, std::string help);
  // A repeatable flag: each occurrence appends its value.
  void Add(std::string name, std::vector<std::string>* target,
           std::string help);

  // Parses args (without the program and command names). InvalidArgument naming
  // the flag for an unknown flag, a missing value, a malformed number or a
  // positional argument. Sets help_requested() for --help / -h.
  absl::Status Parse(const std::vector<std::string>& args);

  bool help_requested() const { return help_requested_; }
  // Whether the flag appeared on the command line.
  bool WasSet(absl::string_view name) const;

  // "usage: tessera generate [flags]" and one line per flag with its default.
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;
    std::variant<std::string*, int64_t*, double*, bool*,
                 std::vector<std::string>*>
        target;
    std::string help;
    std::string default_text;
    bool set = false;
  };
  Flag* Find(absl::string_view name);
  absl::Status Assign(Flag& flag, absl::string_view value);

  std::string command_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
};

}  // namespace tessera

#endif  // TESSERA_LAUNCH_FLAG_PARSER_H_
