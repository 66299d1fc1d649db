// tessera: the command-line front end (see DESIGN.md, "Command line").
//
//   tessera generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3 |
//   --prompts-file F.jsonl)
//                    [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
//                    [--seed S]
//                    [--ignore-eos] [--output text|json] [--chat]
//   tessera bench    --model DIR --batch-size 1 --input-len I --output-len O
//   [--json]
//
// Every failure prints one line, "tessera: <what went wrong>", on stderr and
// exits non-zero.
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launch/commands.h"
#include "launch/flag_parser.h"
#include "runtime/core/status.h"

namespace {

constexpr char kUsage[] =
    "usage: tessera <command> [flags]\n"
    "commands:\n"
    "  generate  generate text from prompts (--model DIR --prompt TEXT ...)\n"
    "  bench     measure prefill and decode speed (--model DIR --input-len I "
    "--output-len O)\n"
    "Run 'tessera <command> --help' for the flags.\n";

absl::Status Generate(const std::vector<std::string>& args, bool* help) {
  tessera::GenerateOptions o;
  double temperature = o.sampling.temperature, top_p = o.sampling.top_p;
  int64_t top_k = 0, seed = -1;
  tessera::FlagParser flags("generate");
  flags.Add("model", &o.model_dir,
            "model folder (config.json, *.safetensors, tokenizer)");
  flags.Add("prompt", &o.prompt,
            "prompt text (BOS added as the tokenizer says)");
  flags.Add("prompt-ids", &o.prompt_ids,
            "comma-separated prompt token ids, used as given");
  flags.Add("prompts-file", &o.prompts_file,
            "JSON lines: {\"prompt\": \"...\"} or {\"prompt_ids\": [...]}");
  flags.Add("max-tokens", &o.max_tokens, "most tokens to generate per prompt");
  flags.Add("temperature", &temperature, "sampling temperature; 0 is greedy");
  flags.Add("top-k", &top_k, "keep the k most likely tokens (0: off)");
  flags.Add("top-p", &top_p, "nucleus sampling mass in (0, 1]");
  flags.Add("seed", &seed, "random seed (-1: nondeterministic)");
  flags.Add("ignore-eos", &o.ignore_eos,
            "keep generating after an end-of-sequence token");
  flags.Add("output", &o.output, "text, or json (one object per prompt)");
  flags.Add("chat", &o.chat,
            "send each text prompt as a user message through the model's chat "
            "template");
  RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    *help = true;
    return absl::OkStatus();
  }
  o.sampling.temperature = static_cast<float>(temperature);
  o.sampling.top_p = static_cast<float>(top_p);
  if (top_k < 0 || top_k > INT32_MAX) {
    return absl::InvalidArgumentError("--top-k must be in [0, 2^31)");
  }
  o.sampling.top_k = static_cast<int32_t>(top_k);
  if (seed < -1)
    return absl::InvalidArgumentError("--seed must be >= 0 (or -1 for none)");
  if (seed >= 0) o.sampling.seed = static_cast<uint64_t>(seed);
  return tessera::RunGenerate(o, std::cout);
}

absl::Status Bench(const std::vector<std::string>& args, bool* help) {
  tessera::BenchOptions o;
  tessera::FlagParser flags("bench");
  flags.Add("model", &o.model_dir, "model folder");
  flags.Add("batch-size", &o.batch_size, "sequences per step");
  flags.Add("input-len", &o.input_len, "prompt tokens (random ids)");
  flags.Add("output-len", &o.output_len, "generated tokens (EOS ignored)");
  flags.Add("iterations", &o.iterations,
            "timed repetitions; the median is reported");
  flags.Add("json", &o.json, "print one JSON object");
  RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    *help = true;
    return absl::OkStatus();
  }
  return tessera::RunBench(o, std::cout);
}

absl::Status Tokenize(const std::vector<std::string>& args, bool* help) {
  tessera::TokenizeOptions o;
  tessera::FlagParser flags("tokenize");
  flags.Add("model", &o.model_dir,
            "model folder, or a folder with only tokenizer files");
  flags.Add("decode", &o.decode,
            "read {\"ids\": [...]} lines and write {\"text\": ...}");
  flags.Add("skip-special-tokens", &o.skip_special_tokens,
            "with --decode: special tokens produce no text");
  RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    *help = true;
    return absl::OkStatus();
  }
  return tessera::RunTokenize(o, std::cin, std::cout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "tessera: no command given (commands: generate, bench, "
                 "tokenize; see "
                 "tessera --help)\n";
    return 2;
  }
  if (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  bool help = false;
  absl::Status status;
  if (command == "generate") {
    status = Generate(args, &help);
  } else if (command == "bench") {
    status = Bench(args, &help);
  } else if (command == "tokenize") {
    status = Tokenize(args, &help);
  } else {
    std::cerr
        << "tessera: unknown command \"" << command
        << "\" (commands: generate, bench, tokenize; see tessera --help)\n";
    return 2;
  }
  if (!status.ok()) {
    std::cout.flush();
    std::cerr << "tessera: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
