// The startup summary every command (generate, bench, serve) prints on rank
// 0 once the model is loaded: what vLLM users look for in its log — the
// weights' dtype and size, the KV cache's capacity in tokens and the
// concurrency it allows at full context ("Maximum concurrency for N tokens
// per request: X.XXx", vLLM's words), the context length and the decode
// CUDA graphs' batch sizes.
#ifndef TESSERA_LAUNCH_STARTUP_SUMMARY_H_
#define TESSERA_LAUNCH_STARTUP_SUMMARY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

struct StartupFacts {
  std::string device = "cpu";            // cpu or cuda.
  std::string weight_dtype = "float32";  // Resolved (no "auto").
  // The resolved --kv-dtype: float32, bfloat16, int8 or fp8 (printed as
  // "fp8 e4m3").
  std::string kv_dtype = "float32";
  // An fp8 cache's scales come from the checkpoint (else they are all 1).
  bool kv_checkpoint_scales = false;
  // Non-empty: how the linear layers are quantized ("fp8 (compressed-tensors)"
  // where the device computes in fp8, "dequantized from fp8
  // (compressed-tensors)" where it does not).
  std::string quantization;
  int ranks = 1;              // tp x pp; > 1: the sizes are rank 0's.
  int64_t weight_bytes = 0;   // This rank's.
  int64_t kv_bytes = 0;       // This rank's pool.
  int64_t num_kv_blocks = 0;  // The job's (every rank holds the same ids).
  int64_t block_size = 16;    // Tokens per block (static: the context).
  bool static_layout = false;
  int64_t max_model_len = 0;           // The context served.
  std::vector<int32_t> graph_buckets;  // Ascending; empty: eager.
  // Why there are no graphs, when there are none ("CPU", "--no-graphs").
  std::string no_graphs_reason;
};

// The summary's lines, without newlines:
//   [tessera] model: bfloat16 weights, 14.96 GiB (16060522496 bytes);
//     context 4096 tokens (with quantization: "bfloat16 weights, linear
//     layers fp8 (compressed-tensors), 8.49 GiB ...")
//   [tessera] KV cache: 2048 blocks x 16 tokens = 32768 tokens (int8,
//     1.00 GiB); Maximum concurrency for 4096 tokens per request: 8.00x
//   [tessera] decode CUDA graphs: 35 batch sizes: 1 2 4 8 16 ... 256
// ("... on rank 0 of 4" after the byte counts of a parallel job; "decode
// CUDA graphs: none (CPU)" without graphs).
std::vector<std::string> StartupSummaryLines(const StartupFacts& facts);

}  // namespace tessera

#endif  // TESSERA_LAUNCH_STARTUP_SUMMARY_H_
