// The libFuzzer entry point every target in tests/fuzz defines. A target is
// linked two ways (tests/fuzz/BUILD.bazel): with clang's -fsanitize=fuzzer
// as a fuzzer (tools/fuzz/run.sh), and with corpus_main.cc as a normal test
// that replays its committed corpus and every crash input found so far.
// A target must never crash, hang or leak on any input: a bad input is an
// error Status, and the target only checks that it is one or a result.
#ifndef TESSERA_TESTS_FUZZ_FUZZ_TARGET_H_
#define TESSERA_TESTS_FUZZ_FUZZ_TARGET_H_

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#endif  // TESSERA_TESTS_FUZZ_FUZZ_TARGET_H_
