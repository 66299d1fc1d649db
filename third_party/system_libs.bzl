"""A repository rule that wraps Debian's static abseil libraries as one cc_library.

Debian ships abseil as ~60 separate archives whose link order follows their internal
dependencies. Linking them as one --start-group/--end-group set avoids maintaining that
order by hand, and static linking keeps binaries runnable on machines without abseil
(the GPU machine has none).
"""

def _abseil_impl(ctx):
    libdir = ctx.path(ctx.attr.libdir)
    archives = sorted([
        str(f)
        for f in libdir.readdir()
        if f.basename.startswith("libabsl_") and f.basename.endswith(".a")
    ])
    if not archives:
        fail("no libabsl_*.a under %s: install libabsl-dev" % ctx.attr.libdir)
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)
    linkopts = ["-Wl,--start-group"] + archives + ["-Wl,--end-group", "-lpthread"]
    ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

# Headers come from /usr/include (a system include directory of the toolchain).
cc_library(
    name = "abseil",
    linkopts = {linkopts},
)
""".format(linkopts = repr(linkopts)))

system_abseil = repository_rule(
    implementation = _abseil_impl,
    attrs = {"libdir": attr.string(default = "/usr/lib/x86_64-linux-gnu")},
    local = True,
)
