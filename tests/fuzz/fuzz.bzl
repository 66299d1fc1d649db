"""One fuzz target, three ways (tests/fuzz/BUILD.bazel)."""

def tessera_fuzz_target(name, deps):
    """<name>_fuzzer.cc as a library, a corpus-replay test and a libFuzzer binary.

    Args:
      name: the target's name; its source is <name>_fuzzer.cc and its seeds
        corpus/<name>/ (crash inputs are kept there too).
      deps: what the source needs.
    """
    native.cc_library(
        name = name + "_lib",
        srcs = [name + "_fuzzer.cc"],
        deps = deps + [":fuzz_target", "//third_party:abseil"],
        alwayslink = True,
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = "small",
        srcs = ["corpus_main.cc"],
        args = ["tests/fuzz/corpus/" + name],
        data = native.glob(["corpus/" + name + "/**"]),
        deps = [":" + name + "_lib", ":fuzz_target"],
    )
    native.cc_binary(
        name = name + "_fuzzer",
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        deps = [":" + name + "_lib"],
    )
