"""cuda_library: compiles .cu files with nvcc (one genrule each) into an alwayslink cc_library.

The kernels target Hopper (sm_90a) and also embed compute_90a PTX. They compile on machines
without a GPU; they run only where one is present.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
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
