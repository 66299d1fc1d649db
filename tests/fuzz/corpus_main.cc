// Replays every file under the directories (or files) given on the command
// line through the target's LLVMFuzzerTestOneInput: the committed seed
// corpus and crash inputs as a normal test (and under --config=asan). Fails
// if a path is unreadable or holds no input, so a test cannot pass on an
// empty corpus.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path root(argv[i]);
    std::error_code error;
    if (fs::is_directory(root, error)) {
      for (const auto& entry : fs::recursive_directory_iterator(root, error)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else if (fs::is_regular_file(root, error)) {
      files.push_back(root);
    } else {
      std::fprintf(stderr, "corpus_main: %s is not a file or directory\n",
                   argv[i]);
      return 1;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "corpus_main: no inputs\n");
    return 1;
  }
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "corpus_main: cannot read %s\n", file.c_str());
      return 1;
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                           bytes.size());
  }
  std::printf("corpus_main: %zu inputs replayed\n", files.size());
  return 0;
}
