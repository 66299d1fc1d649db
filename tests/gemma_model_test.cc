// The Gemma models (gemma, gemma2, gemma3_text) on the CPU against a
// float64 reference of the forward pass as transformers defines it (written
// here from modeling_gemma*.py's semantics, independently of the op set):
// the scaled embedding, (1 + w) RMSNorms, GeGLU, query_pre_attn_scalar,
// attention and final soft caps, sliding windows on sliding layers only,
// sandwich norms, gemma3's q/k norms and its two RoPEs. Tiny random
// checkpoints are written at test time (norm weights random too). Prefill,
// chunked prefill and decode logits must match the reference to f32
// rounding; TP2, PP2 and TP2 x PP2 (threads) must match TP1.
//
// The golden fixtures from transformers itself (tests/fixtures/golden/gemma*)
// are covered by golden_test, parallel_shard_test and the MPI tests.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "nlohmann/json.hpp"
#include "runtime/executor/sequence_runner.h"
#include "runtime/model/gemma.h"
#include "runtime/model/registry.h"
#include "runtime/model/shard.h"
#include "runtime/model/testing/checkpoint_writer.h"
#include "tests/testing/thread_communicator.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

Json BaseConfig(const std::string& model_type, int64_t head_dim = 16) {
  Json c = {{"model_type", model_type},
            {"vocab_size", 96},
            {"hidden_size", 64},
            {"intermediate_size", 128},
            {"num_hidden_layers", 3},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"head_dim", head_dim},
            {"max_position_embeddings", 256},
            {"rms_norm_eps", 1e-6},
            {"bos_token_id", 1},
            {"eos_token_id", 2},
            {"hidden_act", "gelu_pytorch_tanh"},
            {"tie_word_embeddings", true},
            {"dtype", "float32"}};
  if (model_type == "gemma") {
    c["num_key_value_heads"] = 1;
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  } else {
    c["hidden_activation"] = "gelu_pytorch_tanh";
    c["sliding_window"] = 8;
    c["query_pre_attn_scalar"] = 24;
    c["layer_types"] = {"sliding_attention", "full_attention",
                        "sliding_attention"};
  }
  if (model_type == "gemma2") {
    c["attn_logit_softcapping"] = 1.5;
    c["final_logit_softcapping"] = 3.0;
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  }
  if (model_type == "gemma3_text") {
    c["final_logit_softcapping"] = nullptr;
    c["attn_logit_softcapping"] = nullptr;
    c["rope_parameters"] = {
        {"full_attention",
         {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 1e6}}},
        {"sliding_attention",
         {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  }
  return c;
}

using Weights = std::map<std::string, std::vector<double>>;

// Writes config.json and an f32 model.safetensors of N(0, 0.2) values for
// every tensor of the full model (norm weights too: their factor 1 + w is
// then around 1, as in trained Gemmas); returns the values.
Weights WriteModel(const std::string& dir, const Json& json, uint32_t seed) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << json.dump(2);
  auto config = ParseModelConfig(json.dump());
  EXPECT_TRUE(config.ok()) << config.status();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  testing_util::CheckpointWriter writer;
  Weights weights;
  for (const WeightSpec& spec : GemmaWeightTable(*config, FullModel(*config))) {
    std::vector<float> values(static_cast<size_t>(spec.full.numel()));
    for (float& v : values) v = normal(rng);
    writer.AddFloats(spec.name, DType::kF32, spec.full, values);
    weights[spec.name].assign(values.begin(), values.end());
  }
  writer.Write(dir + "/model.safetensors");
  return weights;
}

// ---- The float64 reference -------------------------------------------------

using Vec = std::vector<double>;

// x [n, in] · w[out, in]ᵀ.
Vec MatMul(const Vec& x, int64_t n, const Vec& w, int64_t in, int64_t out) {
  Vec y(n * out, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  }
  return y;
}

// Details of the forward pass the reference can leave out, to show each
// one is seen by the comparison.
struct Ablation {
  bool no_one_plus = false;     // Norms multiply by w, not 1 + w.
  bool no_normalizer = false;   // The embedding is not scaled.
  bool no_caps = false;         // No soft caps.
  bool head_dim_scale = false;  // 1 / sqrt(head_dim), not the scalar.
  bool no_window = false;       // Sliding layers attend to every key.
  bool one_rope = false;        // gemma3's local layers on the global RoPE.
};
thread_local Ablation ablation;

// Gemma's RMSNorm over rows of `dim`: x / rms(x) * (1 + w).
void Norm(Vec* x, int64_t dim, const Vec& w, double eps) {
  const double one = ablation.no_one_plus ? 0.0 : 1.0;
  for (size_t r = 0; r * dim < x->size(); ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i)
      ss += (*x)[r * dim + i] * (*x)[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) {
      (*x)[r * dim + i] = (*x)[r * dim + i] * inv * (one + w[i]);
    }
  }
}

double GeluTanh(double x) {
  return 0.5 * x *
         (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

double Cap(double x, double cap) {
  return cap > 0 && !ablation.no_caps ? std::tanh(x / cap) * cap : x;
}

// Rotates each head [n, heads, D] of x at positions 0..n-1 ("rotate half").
void Rope(Vec* x, int64_t n, int64_t heads, int64_t D, double theta,
          double linear_factor) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      double* v = x->data() + (t * heads + h) * D;
      for (int64_t i = 0; i < D / 2; ++i) {
        const double inv = 1.0 / std::pow(theta, 2.0 * i / D) / linear_factor;
        const double a = t * inv, c = std::cos(a), s = std::sin(a);
        const double x0 = v[i], x1 = v[i + D / 2];
        v[i] = x0 * c - x1 * s;
        v[i + D / 2] = x1 * c + x0 * s;
      }
    }
  }
}

// The logits [V] after the last of `tokens`, recomputing the whole sequence.
Vec Reference(const ModelConfig& c, const Weights& w,
              const std::vector<int32_t>& tokens) {
  const GemmaHParams& g = c.gemma;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, V = c.vocab_size;
  const double eps = c.rms_norm_eps;
  const Vec& embed = w.at("model.embed_tokens.weight");
  const double normalizer =
      ablation.no_normalizer ? 1.0 : static_cast<float>(std::sqrt(double(H)));
  Vec h(n * H);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < H; ++i) {
      h[t * H + i] = embed[tokens[t] * H + i] * normalizer;
    }
  }
  const double scalar = g.query_pre_attn_scalar > 0 && !ablation.head_dim_scale
                            ? g.query_pre_attn_scalar
                            : double(D);
  const double scale = std::pow(scalar, -0.5);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Vec x = h;
    Norm(&x, H, w.at(p + "input_layernorm.weight"), eps);
    Vec q = MatMul(x, n, w.at(p + "self_attn.q_proj.weight"), H, Hq * D);
    Vec k = MatMul(x, n, w.at(p + "self_attn.k_proj.weight"), H, Hkv * D);
    Vec v = MatMul(x, n, w.at(p + "self_attn.v_proj.weight"), H, Hkv * D);
    if (g.qk_norm) {
      Norm(&q, D, w.at(p + "self_attn.q_norm.weight"), eps);
      Norm(&k, D, w.at(p + "self_attn.k_norm.weight"), eps);
    }
    const bool local = c.arch == Architecture::kGemma3 && g.sliding_layer[l] &&
                       !ablation.one_rope;
    const RopeConfig& rope = local ? g.rope_local : c.rope;
    const double factor =
        rope.scaling == RopeScaling::kLinear ? rope.factor : 1.0;
    Rope(&q, n, Hq, D, rope.theta, factor);
    Rope(&k, n, Hkv, D, rope.theta, factor);
    const int64_t window =
        ablation.no_window ? 0 : c.sliding_window_per_layer[l];
    Vec attn(n * Hq * D, 0.0);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t hh = 0; hh < Hq; ++hh) {
        const int64_t kvh = hh / (Hq / Hkv);
        std::vector<double> s;
        double mx = -INFINITY;
        const int64_t first =
            window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
        for (int64_t j = first; j <= t; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += q[(t * Hq + hh) * D + d] * k[(j * Hkv + kvh) * D + d];
          }
          s.push_back(Cap(dot * scale, g.attn_logit_softcapping));
          mx = std::max(mx, s.back());
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int64_t j = first; j <= t; ++j) {
          for (int64_t d = 0; d < D; ++d) {
            attn[(t * Hq + hh) * D + d] +=
                s[j - first] / sum * v[(j * Hkv + kvh) * D + d];
          }
        }
      }
    }
    Vec a = MatMul(attn, n, w.at(p + "self_attn.o_proj.weight"), Hq * D, H);
    if (g.sandwich_norms) {
      Norm(&a, H, w.at(p + "post_attention_layernorm.weight"), eps);
    }
    for (size_t i = 0; i < h.size(); ++i) h[i] += a[i];
    x = h;
    Norm(&x, H,
         w.at(p + (g.sandwich_norms ? "pre_feedforward_layernorm.weight"
                                    : "post_attention_layernorm.weight")),
         eps);
    const Vec gate = MatMul(x, n, w.at(p + "mlp.gate_proj.weight"), H, I);
    const Vec up = MatMul(x, n, w.at(p + "mlp.up_proj.weight"), H, I);
    Vec act(n * I);
    for (size_t i = 0; i < act.size(); ++i) act[i] = GeluTanh(gate[i]) * up[i];
    Vec m = MatMul(act, n, w.at(p + "mlp.down_proj.weight"), I, H);
    if (g.sandwich_norms) {
      Norm(&m, H, w.at(p + "post_feedforward_layernorm.weight"), eps);
    }
    for (size_t i = 0; i < h.size(); ++i) h[i] += m[i];
  }
  Vec last(h.end() - H, h.end());
  Norm(&last, H, w.at("model.norm.weight"), eps);
  Vec logits = MatMul(last, 1, embed, H, V);
  for (double& x : logits) x = Cap(x, g.final_logit_softcapping);
  return logits;
}

// ‖got − want‖ / ‖want‖.
double RelativeError(const std::vector<float>& got, const Vec& want) {
  double d = 0, r = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d += (got[i] - want[i]) * (got[i] - want[i]);
    r += want[i] * want[i];
  }
  return std::sqrt(d / r);
}

std::vector<int32_t> Sequence(int64_t n, int64_t vocab) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> s(n);
  for (int32_t& t : s) t = id(rng);
  return s;
}

constexpr int64_t kPrompt = 21;  // Past the window of 8, and a chunk of 7.
constexpr int64_t kDecodes = 12;

// Prefill of kPrompt tokens then kDecodes decodes of the sequence's next
// tokens: the logits after each.
std::vector<std::vector<float>> RunSequence(Model* model,
                                            const std::vector<int32_t>& seq,
                                            bool last_stage,
                                            DType cache_dtype = DType::kF32) {
  SequenceRunner runner(model);
  auto cache = runner.NewKvCache(kPrompt + kDecodes, cache_dtype);
  EXPECT_TRUE(cache.ok()) << cache.status();
  const int64_t V = model->config().vocab_size;
  std::vector<std::vector<float>> out;
  std::vector<float> logits(V);
  float* dst = last_stage ? logits.data() : nullptr;
  absl::Status s =
      runner.Forward(absl::MakeConstSpan(seq.data(), kPrompt), &*cache, dst);
  EXPECT_TRUE(s.ok()) << s;
  out.push_back(logits);
  for (int64_t i = 0; i < kDecodes; ++i) {
    s = runner.Forward(absl::MakeConstSpan(seq.data() + kPrompt + i, 1),
                       &*cache, dst);
    EXPECT_TRUE(s.ok()) << s;
    out.push_back(logits);
  }
  return out;
}

class GemmaModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR")
                                                  : "/tmp") +
           "/gemma_" + GetParam();
    json_ = BaseConfig(GetParam());
    weights_ = WriteModel(dir_, json_, 1234);
    auto config = LoadModelConfig(dir_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    seq_ = Sequence(kPrompt + kDecodes, config_.vocab_size);
  }

  std::string dir_;
  Json json_;
  Weights weights_;
  ModelConfig config_;
  std::vector<int32_t> seq_;
};

TEST_P(GemmaModelTest, PrefillAndDecodeMatchTheReference) {
  for (const int64_t chunk : {0, 7}) {  // One prefill step, or chunks of 7.
    SCOPED_TRACE(chunk == 0 ? "one step" : "chunks of 7");
    CpuOps ops;
    auto model = LoadModel(dir_, &ops, chunk);
    ASSERT_TRUE(model.ok()) << model.status();
    const std::vector<std::vector<float>> got =
        RunSequence(model->get(), seq_, /*last_stage=*/true);
    double worst_logit = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const std::vector<int32_t> prefix(seq_.begin(),
                                        seq_.begin() + kPrompt + i);
      const Vec want = Reference(config_, weights_, prefix);
      EXPECT_LT(RelativeError(got[i], want), 2e-5) << "step " << i;
      for (float x : got[i])
        worst_logit = std::max(worst_logit, double(std::fabs(x)));
    }
    if (config_.gemma.final_logit_softcapping > 0) {
      // The cap binds (the reference caps too): no logit reaches it.
      EXPECT_LT(worst_logit, config_.gemma.final_logit_softcapping);
      EXPECT_GT(worst_logit, 0.5 * config_.gemma.final_logit_softcapping);
    }
  }
}

// The comparison above sees each Gemma detail: the reference without the
// (1 + w) offset, the normalizer, the caps or the attention scalar is far
// from the model, and so is the one without the sliding windows or
// (gemma3) with one RoPE for every layer.
TEST_P(GemmaModelTest, EachDetailIsSeen) {
  CpuOps ops;
  auto model = LoadModel(dir_, &ops);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<std::vector<float>> got =
      RunSequence(model->get(), seq_, /*last_stage=*/true);
  const std::vector<int32_t> prompt(seq_.begin(), seq_.begin() + kPrompt);
  std::vector<Ablation> ablations(2);
  ablations[0].no_one_plus = true;
  ablations[1].no_normalizer = true;
  if (config_.gemma.attn_logit_softcapping > 0 ||
      config_.gemma.final_logit_softcapping > 0) {
    ablations.emplace_back().no_caps = true;
  }
  if (config_.gemma.query_pre_attn_scalar > 0) {
    ablations.emplace_back().head_dim_scale = true;
    ablations.emplace_back().no_window = true;
  }
  if (config_.arch == Architecture::kGemma3) {
    ablations.emplace_back().one_rope = true;
  }
  for (size_t i = 0; i < ablations.size(); ++i) {
    ablation = ablations[i];
    const Vec off = Reference(config_, weights_, prompt);
    ablation = Ablation();
    EXPECT_GT(RelativeError(got[0], off), 1e-2) << "ablation " << i;
  }
}

// Tensor- and pipeline-parallel shards as threads: the logits of TP1.
TEST_P(GemmaModelTest, ShardsMatchOneRank) {
  CpuOps single_ops;
  auto single = LoadModel(dir_, &single_ops);
  ASSERT_TRUE(single.ok()) << single.status();
  const std::vector<std::vector<float>> want =
      RunSequence(single->get(), seq_, true);
  struct Layout {
    int tp, pp;
  };
  for (const Layout layout : {Layout{2, 1}, Layout{1, 2}, Layout{2, 2}}) {
    SCOPED_TRACE(::testing::Message()
                 << "tp " << layout.tp << " pp " << layout.pp);
    const int world = layout.tp * layout.pp;
    std::vector<std::unique_ptr<ThreadGroup>> tp_groups, pp_groups;
    for (int s = 0; s < layout.pp; ++s)
      tp_groups.push_back(std::make_unique<ThreadGroup>(layout.tp));
    for (int r = 0; r < layout.tp; ++r)
      pp_groups.push_back(std::make_unique<ThreadGroup>(layout.pp));
    std::vector<std::vector<std::vector<float>>> got(world);
    std::vector<absl::Status> status(world);
    auto rank_main = [&](int rank) {
      const int stage = rank / layout.tp, tp_rank = rank % layout.tp;
      auto shard = MakeShardSpec(config_, tp_rank, layout.tp, stage, layout.pp);
      if (!shard.ok()) {
        status[rank] = shard.status();
        std::abort();  // The others would wait forever.
      }
      auto ckpt = Checkpoint::Open(dir_);
      CpuOps ops;
      WeightLoadOptions load;
      load.device = &ops;
      auto weights = LoadShardWeights(**ckpt, config_, *shard, load);
      if (!weights.ok()) {
        status[rank] = weights.status();
        std::abort();
      }
      ModelContext context;
      context.ops = &ops;
      context.tp = tp_groups[stage]->member(tp_rank);
      context.pp = pp_groups[tp_rank]->member(stage);
      auto model = CreateModel(config_, *shard, *std::move(weights), context);
      if (!model.ok()) {
        status[rank] = model.status();
        std::abort();
      }
      got[rank] = RunSequence(model->get(), seq_, shard->last_stage());
    };
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) threads.emplace_back(rank_main, r);
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < world; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
    for (int r = (layout.pp - 1) * layout.tp; r < world; ++r) {
      ASSERT_EQ(got[r].size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        const Vec w(want[i].begin(), want[i].end());
        EXPECT_LT(RelativeError(got[r][i], w), 1e-5)
            << "rank " << r << " step " << i;
      }
    }
  }
}

// The gpu-tagged twin (TESSERA_TEST_DEVICE=cuda): the model on CUDA against
// the same reference, head_dim 64 so the tensor-core attention runs for a
// bf16 cache. f32 matrices and cache (the golden mode) within f32 rounding;
// bf16 matrices (the reference rounds them too) and a bf16 cache within
// bf16's.
TEST_P(GemmaModelTest, CudaMatchesTheReference) {
  const char* device = std::getenv("TESSERA_TEST_DEVICE");
  if (device == nullptr || std::string(device) != "cuda") {
    GTEST_SKIP() << "the CUDA twin (gemma_model_cuda_test) runs this";
  }
  if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = dir_ + "_d64";
  const Weights weights = WriteModel(dir, BaseConfig(GetParam(), 64), 99);
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto backend = CreateBackend("cuda", 0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    ModelPlacement placement;
    placement.allocator = backend->allocator.get();
    placement.matrix_dtype = dtype;
    auto model = LoadModel(dir, backend->ops.get(), 0, 1, placement);
    ASSERT_TRUE(model.ok()) << model.status();
    const std::vector<std::vector<float>> got =
        RunSequence(model->get(), seq_, true, dtype);
    Weights rounded = weights;
    if (dtype == DType::kBF16) {
      for (auto& [name, values] : rounded) {
        if (name.find("norm") != std::string::npos) continue;
        for (double& v : values) {
          float f = static_cast<float>(v);
          uint32_t bits;
          std::memcpy(&bits, &f, 4);
          bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
          std::memcpy(&f, &bits, 4);
          v = f;
        }
      }
    }
    const double tol = dtype == DType::kF32 ? 1e-4 : 3e-2;
    for (size_t i = 0; i < got.size(); ++i) {
      const std::vector<int32_t> prefix(seq_.begin(),
                                        seq_.begin() + kPrompt + i);
      EXPECT_LT(RelativeError(got[i], Reference(*config, rounded, prefix)), tol)
          << "step " << i;
    }
    model->reset();
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, GemmaModelTest,
                         ::testing::Values("gemma", "gemma2", "gemma3_text"));

}  // namespace
}  // namespace tessera
