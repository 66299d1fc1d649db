"""CUDA targets that exist only where the CUDA toolkit was found (@cuda, cuda_configure.bzl).

Without a toolkit (no nvcc at $TESSERA_CUDA_PATH, $CUDA_PATH or /usr/local/cuda) the macros
below define nothing, so `bazel build //...` and `bazel test //...` build the CPU backend alone:
the CUDA kernels, their gpu-tagged tests and the GPU benchmarks are not targets of that build
(`bazel test //kernels/cuda:cuda_ops_test` says "no such target"). Tests that reach the GPU
through //kernels/backend (tests:decode_*_cuda_test) stay and skip, as they do on a machine
with the toolkit and no GPU. `if_cuda` picks the sources and deps of the targets that build
either way (the backend, the tensor communicators).

cuda_library compiles .cu files with nvcc (one genrule each) into an alwayslink cc_library.
The kernels target Hopper (sm_90a) and also embed compute_90a PTX. They compile on machines
without a GPU; they run only where one is present.
"""

load("@cuda//:defs.bzl", "CUDA_FOUND", "NVCC")

def if_cuda(if_found, if_not_found = []):
    """`if_found` in a build with the CUDA toolkit, else `if_not_found`."""
    return if_found if CUDA_FOUND else if_not_found

def cuda_cc_library(**kwargs):
    """A cc_library that builds against CUDA: defined only where the toolkit was found."""
    if CUDA_FOUND:
        native.cc_library(**kwargs)

def cuda_cc_binary(**kwargs):
    """A cc_binary that links CUDA: defined only where the toolkit was found."""
    if CUDA_FOUND:
        native.cc_binary(**kwargs)

def cuda_cc_test(**kwargs):
    """A cc_test of CUDA code (tag it gpu): defined only where the toolkit was found."""
    if CUDA_FOUND:
        native.cc_test(**kwargs)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    """.cu files compiled by nvcc; defined only where the toolkit was found."""
    if not CUDA_FOUND:
        return
    objs = []
    for src in srcs:
        if not src.endswith(".cu"):
            fail("cuda_library srcs must be .cu files, got " + src)
        obj = name + "_" + src.replace("/", "_")[:-3] + ".o"
        native.genrule(
            name = name + "_" + src.replace("/", "_")[:-3] + "_nvcc",
            srcs = [src] + [h for h in native.glob(["**/*.h", "**/*.cuh"]) if h not in hdrs] + hdrs,
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-std=c++17 -O3 --expt-relaxed-constexpr",
                "-gencode arch=compute_90a,code=sm_90a",
                "-gencode arch=compute_90a,code=compute_90a",
                "-Xcompiler -fPIC",
                "-I.",
                "-I$(GENDIR)",
            ] + copts + [
                "-c $(location " + src + ")",
                "-o $@",
            ]),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        alwayslink = 1,
        linkstatic = 1,
        **kwargs
    )
