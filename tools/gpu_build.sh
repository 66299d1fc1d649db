#!/usr/bin/env bash
# Builds here what tools/gpu_check.sh runs on the GPU machine and puts it in .carry/gpu
# (git-ignored; name it in the device call's carry list): the tessera binary, the GPU test
# binaries, the shared libraries the GPU machine lacks, and the demo checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
# The GPU tests are targets only in a build with the CUDA toolkit (third_party/cuda.bzl).
cuda=${TESSERA_CUDA_PATH:-${CUDA_PATH:-/usr/local/cuda}}
if [[ ! -x "$cuda/bin/nvcc" ]]; then
  echo "tools/gpu_build.sh: no CUDA toolkit at $cuda (no bin/nvcc): install CUDA 13 or set" \
    "TESSERA_CUDA_PATH; without it the CUDA backend and its tests are not built" >&2
  exit 1
fi
TARGETS=(//launch:tessera //kernels/cuda:elementwise_kernels_test
  //kernels/cuda:sampling_kernels_test //kernels/cuda:attention_kernels_test
  //kernels/cuda:cuda_memory_source_test //kernels/cuda:cuda_ops_test
  //kernels/cuda:sample_parity_test //kernels/cuda:gemm_plans_test //kernels/cuda:fused_ops_test
  //tests:decode_allocations_cuda_test //tests:decode_graphs_cuda_test
  //kernels/cuda:skinny_gemm_test //kernels/cuda:flash_prefill_test
  //kernels/cuda:decode_attention_test //kernels/cuda:decode_attention_bench
  //kernels/cuda:gemm_bench //kernels/cuda:moe_kernels_test //tests:moe_model_cuda_test
  //tests:gemma_model_cuda_test //kernels/cuda:fp8_gemm_test //tests:fp8_accuracy_cuda_test)
bazel build -c opt "${TARGETS[@]}"
rm -rf .carry/gpu && mkdir -p .carry/gpu/bin .carry/gpu/lib
for t in "${TARGETS[@]}"; do
  path=${t#//}
  cp "bazel-bin/${path%%:*}/${path##*:}" .carry/gpu/bin/
done
for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libutf8proc.so.2 \
  libsentencepiece.so.0 libpcre2-8.so.0 libcpp-httplib.so.0.11 libbrotlicommon.so.1 \
  libbrotlidec.so.1 libbrotlienc.so.1 libbenchmark.so.1debian libprometheus-cpp-core.so.1.0; do
  cp -L "/lib/x86_64-linux-gnu/$lib" .carry/gpu/lib/
done
cp -r ../shared/models/stories260K .carry/gpu/stories260K
cp -r ../shared/tokenizers/qwen3 .carry/gpu/qwen3_tokenizer
strip .carry/gpu/bin/*
# The carry limit is 64 MiB with the repository: the binaries (each test links the kernels),
# the libraries and the tokenizer travel compressed; tools/gpu_check.sh unpacks them.
# xz with a dictionary larger than a binary: every test links the same kernel images, so the
# second copy of each costs almost nothing (282 MB of binaries pack into ~12 MB; the default
# 8 MiB dictionary gave over 80 MB).
for part in bin lib qwen3_tokenizer; do
  tar -C .carry/gpu -cf - "$part" | xz -T2 --lzma2=preset=6,dict=512MiB \
    >".carry/gpu/$part.tar.xz"
  rm -rf ".carry/gpu/$part"
done
du -sh .carry/gpu
