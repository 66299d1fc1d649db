// Timing of the split decode (decode_attention.h) beside the old decode
// kernel and the card's copy bandwidth, in one binary (CUDA events).
//
// Copy bandwidth: cudaMemcpyAsync device to device of 2 GiB, counting bytes
// read plus written (the convention of the 4.27 TB/s). Decode: GB/s of
// K and V read (batch x context x kv heads x D x 2 x element size) over the
// mean time of back-to-back launches; block tables are a random permutation
// of the cache's blocks, q is random, the cache holds a constant (the values
// do not change the traffic). Prints one line per case and a summary line
// "decode_bw_fraction" for the acceptance shape (64 x 4096, 32/8 heads,
// D 128, bf16, block 16): its GB/s over the copy bandwidth (target >= 0.70).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/attention/decode_attention.h"

namespace {

#define CHECK_CUDA(expr)                                                \
  do {                                                                  \
    const cudaError_t e_ = (expr);                                      \
    if (e_ != cudaSuccess) {                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(e_));                             \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)

using tessera::cuda::KvDType;

double CopyBandwidth() {
  const size_t bytes = size_t{2} << 30;
  void *a, *b;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i)
    CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
  const int iters = 10;
  CHECK_CUDA(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i)
    CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
  CHECK_CUDA(cudaEventRecord(e1));
  CHECK_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  const double gbps = 2.0 * bytes * iters / (ms * 1e-3) / 1e9;
  std::printf("copy D2D %.2f GiB x%d: %.3f ms each, %.1f GB/s (read+write)\n",
              bytes / double(1 << 30), iters, ms / iters, gbps);
  return gbps;
}

struct Case {
  int32_t batch, context, heads, kv_heads, dim, block;
  KvDType dtype;
  int32_t grid_max;  // 0: max_seq_len.
  bool old_kernel;
};

double RunCase(const Case& c, double copy_gbps) {
  const size_t elem = c.dtype == KvDType::kBF16 ? 2 : 4;
  const int32_t blocks_per_seq = (c.context + c.block - 1) / c.block;
  const int64_t num_blocks = int64_t{c.batch} * blocks_per_seq;
  const int64_t slots = num_blocks * c.block;
  const size_t cache_bytes = size_t(slots) * c.kv_heads * c.dim * elem;
  void *k, *v;
  CHECK_CUDA(cudaMalloc(&k, cache_bytes));
  CHECK_CUDA(cudaMalloc(&v, cache_bytes));
  CHECK_CUDA(cudaMemset(k, 0x3c, cache_bytes));
  CHECK_CUDA(cudaMemset(v, 0x3c, cache_bytes));
  std::mt19937 rng(7);
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> qsl(c.batch + 1), lens(c.batch, c.context),
      ctx(c.batch, c.context - 1);
  std::iota(qsl.begin(), qsl.end(), 0);
  std::vector<float> q(size_t(c.batch) * c.heads * c.dim);
  std::normal_distribution<float> normal;
  for (float& x : q) x = normal(rng);
  int32_t *dqsl, *dlens, *dctx, *dbt;
  float *dq, *dout;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dqsl), qsl.size() * 4));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dlens), lens.size() * 4));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dctx), ctx.size() * 4));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dbt), ids.size() * 4));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dq), q.size() * 4));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dout), q.size() * 4));
  CHECK_CUDA(
      cudaMemcpy(dqsl, qsl.data(), qsl.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(
      cudaMemcpy(dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(
      cudaMemcpy(dctx, ctx.data(), ctx.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(
      cudaMemcpy(dbt, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));

  tessera::cuda::DeviceKvLayer layer;
  layer.k = k;
  layer.v = v;
  layer.dtype = c.dtype;
  layer.num_slots = slots;
  layer.num_kv_heads = c.kv_heads;
  layer.head_dim = layer.head_dim_v = c.dim;
  tessera::cuda::DeviceAttentionMetadata m;
  m.query_start_loc = dqsl;
  m.context_lens = dctx;
  m.seq_lens = dlens;
  m.block_tables = dbt;
  m.max_blocks_per_seq = blocks_per_seq;
  m.block_size = c.block;
  m.num_seqs = c.batch;
  m.num_tokens = c.batch;
  m.max_query_len = 1;
  m.max_seq_len = c.context;
  m.grid_max_seq_len = c.grid_max;
  const int64_t bound = c.grid_max > 0 ? c.grid_max : c.context;
  const size_t ws_bytes = c.old_kernel
                              ? tessera::cuda::DecodeAttentionWorkspaceBytes(
                                    c.batch, c.heads, c.dim, c.context)
                              : tessera::cuda::DecodeSplitWorkspaceBytes(
                                    c.batch, c.heads, c.dim, bound);
  void* ws;
  CHECK_CUDA(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 16)));
  const float scale = 1.0f / 11.3137f;
  auto launch = [&]() {
    if (c.old_kernel) {
      return tessera::cuda::LaunchDecodeAttention(
          dq, c.heads, layer, m, 0, c.batch, 0, scale, /*softcap=*/0.0f, dout,
          ws, ws_bytes, nullptr);
    }
    return tessera::cuda::LaunchSplitDecodeAttention(
        dq, c.heads, layer, m, 0, c.batch, 0, scale, /*softcap=*/0.0f, dout, ws,
        ws_bytes, nullptr);
  };
  for (int i = 0; i < 3; ++i) CHECK_CUDA(launch());
  CHECK_CUDA(cudaDeviceSynchronize());
  const int iters = c.batch * int64_t{c.context} >= 65536 ? 20 : 200;
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  CHECK_CUDA(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) CHECK_CUDA(launch());
  CHECK_CUDA(cudaEventRecord(e1));
  CHECK_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  const double t = ms * 1e-3 / iters;
  const double kv_bytes =
      2.0 * c.batch * double(c.context) * c.kv_heads * c.dim * elem;
  const double gbps = kv_bytes / t / 1e9;
  std::printf(
      "%s batch %d x context %d, heads %d/%d, D %d, %s, block %d, grid bound "
      "%d: %.1f us, KV %.1f MB, %.1f GB/s = %.1f%% of copy\n",
      c.old_kernel ? "old-decode  " : "split-decode", c.batch, c.context,
      c.heads, c.kv_heads, c.dim, c.dtype == KvDType::kBF16 ? "bf16" : "f32",
      c.block, static_cast<int>(bound), t * 1e6, kv_bytes / 1e6, gbps,
      100.0 * gbps / copy_gbps);
  for (void* p : {static_cast<void*>(dqsl), static_cast<void*>(dlens),
                  static_cast<void*>(dctx), static_cast<void*>(dbt),
                  static_cast<void*>(dq), static_cast<void*>(dout), ws, k, v})
    CHECK_CUDA(cudaFree(p));
  return gbps;
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const double copy = CopyBandwidth();
  const KvDType bf16 = KvDType::kBF16, f32 = KvDType::kF32;
  const double main_gbps =
      RunCase({64, 4096, 32, 8, 128, 16, bf16, 0, false}, copy);
  RunCase({64, 4096, 32, 8, 128, 16, bf16, 32768, false}, copy);
  RunCase({64, 4096, 32, 8, 128, 16, bf16, 0, true}, copy);
  RunCase({1, 4096, 32, 8, 128, 16, bf16, 0, false}, copy);
  RunCase({1, 4096, 32, 8, 128, 16, bf16, 32768, false}, copy);
  RunCase({1, 4096, 32, 8, 128, 16, bf16, 0, true}, copy);
  RunCase({64, 512, 32, 8, 128, 16, bf16, 0, false}, copy);
  RunCase({64, 512, 32, 8, 128, 16, bf16, 0, true}, copy);
  RunCase({64, 4096, 32, 8, 128, 16, f32, 0, false}, copy);
  RunCase({64, 4096, 64, 8, 128, 16, bf16, 0, false}, copy);  // Group 8.
  RunCase({64, 4096, 16, 8, 64, 32, bf16, 0, false}, copy);   // D 64.
  RunCase({256, 1024, 32, 8, 128, 16, bf16, 0, false}, copy);
  std::printf("decode_bw_fraction %.3f (target >= 0.70)\n", main_gbps / copy);
  return 0;
}
