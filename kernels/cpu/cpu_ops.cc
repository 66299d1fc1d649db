#include "kernels/cpu/cpu_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// Work (in multiply-adds) below which threads cost more than they save.
constexpr int64_t kParallelThreshold = 1 << 16;
// Multiply-adds below which a matrix product runs on one OpenBLAS thread.
constexpr int64_t kBlasParallelThreshold = int64_t{1} << 23;

absl::Status CheckF32(absl::string_view op, absl::string_view name,
                      const TensorView& t) {
  if (t.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " must be f32, got ", DTypeName(t.dtype())));
  }
  if (t.data() == nullptr && t.numel() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " has no storage"));
  }
  return absl::OkStatus();
}

absl::Status ShapeError(absl::string_view op, absl::string_view what,
                        const Shape& a, const Shape& b) {
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": ", what, " (", a.ToString(), " vs ", b.ToString(), ")"));
}

}  // namespace

absl::Status CpuOps::Embedding(const TensorView& table,
                               absl::Span<const int32_t> ids,
                               const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("Embedding", "table", table));
  RETURN_IF_ERROR(CheckF32("Embedding", "out", out));
  if (table.shape().rank() != 2 || out.shape().rank() != 2 ||
      out.shape()[0] != static_cast<int64_t>(ids.size()) ||
      out.shape()[1] != table.shape()[1]) {
    return ShapeError("Embedding", "table [V, H] and out [T, H] disagree",
                      table.shape(), out.shape());
  }
  const int64_t vocab = table.shape()[0];
  const int64_t hidden = table.shape()[1];
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("Embedding: token id ", ids[t],
                       " is outside the vocabulary [0, ", vocab, ")"));
    }
    std::copy_n(table.data_as<const float>() + ids[t] * hidden, hidden,
                out.data_as<float>() + t * hidden);
  }
  return absl::OkStatus();
}

absl::Status CpuOps::EmbeddingShard(const TensorView& table,
                                    absl::Span<const int32_t> ids,
                                    int64_t first_id, const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("EmbeddingShard", "table", table));
  RETURN_IF_ERROR(CheckF32("EmbeddingShard", "out", out));
  if (table.shape().rank() != 2 || out.shape().rank() != 2 ||
      out.shape()[0] != static_cast<int64_t>(ids.size()) ||
      out.shape()[1] != table.shape()[1]) {
    return ShapeError("EmbeddingShard", "table [V, H] and out [T, H] disagree",
                      table.shape(), out.shape());
  }
  const int64_t rows = table.shape()[0];
  const int64_t hidden = table.shape()[1];
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("EmbeddingShard: negative token id ", ids[t]));
    }
    float* row = out.data_as<float>() + t * hidden;
    const int64_t local = ids[t] - first_id;
    if (local >= 0 && local < rows) {
      std::copy_n(table.data_as<const float>() + local * hidden, hidden, row);
    } else {
      std::fill_n(row, hidden, 0.0f);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuOps::RmsNorm(const TensorView& x, const TensorView& weight,
                             float eps, const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("RmsNorm", "x", x));
  RETURN_IF_ERROR(CheckF32("RmsNorm", "weight", weight));
  RETURN_IF_ERROR(CheckF32("RmsNorm", "out", out));
  if (x.shape() != out.shape() || weight.shape().rank() != 1 ||
      x.shape().rank() < 1 ||
      x.shape()[x.shape().rank() - 1] != weight.shape()[0]) {
    return ShapeError("RmsNorm", "x [R, N], weight [N] and out [R, N] disagree",
                      x.shape(), weight.shape());
  }
  const int64_t n = weight.shape()[0];
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const float* w = weight.data_as<const float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x.data_as<const float>() + r * n;
    float* o = out.data_as<float>() + r * n;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < n; ++i)
      sum_sq += static_cast<double>(in[i]) * in[i];
    const float inv_rms =
        1.0f /
        std::sqrt(static_cast<float>(sum_sq / static_cast<double>(n)) + eps);
    for (int64_t i = 0; i < n; ++i) o[i] = (in[i] * inv_rms) * w[i];
  }
  return absl::OkStatus();
}

absl::Status CpuOps::Add(const TensorView& a, const TensorView& b,
                         const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("Add", "a", a));
  RETURN_IF_ERROR(CheckF32("Add", "b", b));
  RETURN_IF_ERROR(CheckF32("Add", "out", out));
  if (a.shape() != b.shape() || a.shape() != out.shape()) {
    return ShapeError("Add", "operand shapes differ", a.shape(), b.shape());
  }
  const float* pa = a.data_as<const float>();
  const float* pb = b.data_as<const float>();
  float* po = out.data_as<float>();
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
  return absl::OkStatus();
}

absl::Status CpuOps::Linear(const TensorView& x, const TensorView& weight,
                            const TensorView* bias, const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("Linear", "x", x));
  RETURN_IF_ERROR(CheckF32("Linear", "weight", weight));
  RETURN_IF_ERROR(CheckF32("Linear", "out", out));
  if (x.shape().rank() != 2 || weight.shape().rank() != 2 ||
      out.shape().rank() != 2 || x.shape()[1] != weight.shape()[1] ||
      out.shape()[0] != x.shape()[0] || out.shape()[1] != weight.shape()[0]) {
    return ShapeError("Linear",
                      "x [T, K], weight [N, K] and out [T, N] disagree",
                      x.shape(), weight.shape());
  }
  const int64_t t = x.shape()[0];
  const int64_t k = x.shape()[1];
  const int64_t n = weight.shape()[0];
  if (bias != nullptr) {
    RETURN_IF_ERROR(CheckF32("Linear", "bias", *bias));
    if (bias->shape() != Shape({n})) {
      return ShapeError("Linear", "bias must be [N]", bias->shape(),
                        weight.shape());
    }
  }
  if (t == 0 || n == 0) return absl::OkStatus();
  // Waking OpenBLAS's threads costs more than small products take (measured on
  // the demo model: 128-token prefill 10x slower with 2 threads), so they only
  // run for large ones.
  static const int max_threads = openblas_get_num_threads();
  openblas_set_num_threads(t * n * k >= kBlasParallelThreshold ? max_threads
                                                               : 1);
  float* o = out.data_as<float>();
  if (t == 1) {
    // A single token is a matrix-vector product: gemv streams the weight once.
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f,
                weight.data_as<const float>(), k, x.data_as<const float>(), 1,
                0.0f, o, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, n, k, 1.0f,
                x.data_as<const float>(), k, weight.data_as<const float>(), k,
                0.0f, o, n);
  }
  if (bias != nullptr) {
    const float* b = bias->data_as<const float>();
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t c = 0; c < n; ++c) o[r * n + c] += b[c];
    }
  }
  return absl::OkStatus();
}

absl::Status CpuOps::Rope(const TensorView& x,
                          absl::Span<const int32_t> positions,
                          const TensorView& inv_freq) {
  RETURN_IF_ERROR(CheckF32("Rope", "x", x));
  RETURN_IF_ERROR(CheckF32("Rope", "inv_freq", inv_freq));
  if (x.shape().rank() != 3 ||
      x.shape()[0] != static_cast<int64_t>(positions.size()) ||
      x.shape()[2] % 2 != 0 || inv_freq.shape() != Shape({x.shape()[2] / 2})) {
    return ShapeError("Rope",
                      "x [T, heads, D] needs T positions and inv_freq [D/2]",
                      x.shape(), inv_freq.shape());
  }
  const int64_t tokens = x.shape()[0];
  const int64_t heads = x.shape()[1];
  const int64_t dim = x.shape()[2];
  const int64_t half = dim / 2;
  const float* freq = inv_freq.data_as<const float>();
  std::vector<float> cos_table(half), sin_table(half);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // Same operation order as Hugging Face: angle = float(position) *
      // inv_freq in f32.
      const float angle = static_cast<float>(positions[t]) * freq[i];
      cos_table[i] = std::cos(angle);
      sin_table[i] = std::sin(angle);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.data_as<float>() + (t * heads + h) * dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * cos_table[i] - b * sin_table[i];
        v[i + half] = b * cos_table[i] + a * sin_table[i];
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuOps::BiasAdd(const TensorView& x, const TensorView& bias) {
  RETURN_IF_ERROR(CheckF32("BiasAdd", "x", x));
  RETURN_IF_ERROR(CheckF32("BiasAdd", "bias", bias));
  if (x.shape().rank() != 2 || bias.shape() != Shape({x.shape()[1]})) {
    return ShapeError("BiasAdd", "x [T, N] needs bias [N]", x.shape(),
                      bias.shape());
  }
  const int64_t n = x.shape()[1];
  const float* b = bias.data_as<const float>();
  for (int64_t r = 0; r < x.shape()[0]; ++r) {
    float* row = x.data_as<float>() + r * n;
    for (int64_t i = 0; i < n; ++i) row[i] += b[i];
  }
  return absl::OkStatus();
}

absl::Status CpuOps::SiluMul(const TensorView& gate, const TensorView& up,
                             const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("SiluMul", "gate", gate));
  RETURN_IF_ERROR(CheckF32("SiluMul", "up", up));
  RETURN_IF_ERROR(CheckF32("SiluMul", "out", out));
  if (gate.shape() != up.shape() || gate.shape() != out.shape()) {
    return ShapeError("SiluMul", "gate, up and out must match", gate.shape(),
                      up.shape());
  }
  const float* g = gate.data_as<const float>();
  const float* u = up.data_as<const float>();
  float* o = out.data_as<float>();
  const int64_t n = gate.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  return absl::OkStatus();
}

absl::Status CpuOps::StoreKv(const TensorView& k, const TensorView& v,
                             int64_t start_pos, const TensorView& k_cache,
                             const TensorView& v_cache) {
  RETURN_IF_ERROR(CheckF32("StoreKv", "k", k));
  RETURN_IF_ERROR(CheckF32("StoreKv", "v", v));
  RETURN_IF_ERROR(CheckF32("StoreKv", "k_cache", k_cache));
  RETURN_IF_ERROR(CheckF32("StoreKv", "v_cache", v_cache));
  const Shape& ks = k.shape();
  const Shape& cs = k_cache.shape();
  if (ks.rank() != 3 || cs.rank() != 3 || ks[1] != cs[1] || ks[2] != cs[2] ||
      v.shape()[0] != ks[0] || v.shape().rank() != 3 ||
      v_cache.shape().rank() != 3 || v.shape()[1] != v_cache.shape()[1] ||
      v.shape()[2] != v_cache.shape()[2] || v_cache.shape()[0] != cs[0] ||
      start_pos < 0 || start_pos + ks[0] > cs[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("StoreKv: cannot write k ", ks.ToString(), " / v ",
                     v.shape().ToString(), " at row ", start_pos, " of caches ",
                     cs.ToString(), " / ", v_cache.shape().ToString()));
  }
  std::copy_n(k.data_as<const float>(), k.numel(),
              k_cache.data_as<float>() + start_pos * cs[1] * cs[2]);
  std::copy_n(v.data_as<const float>(), v.numel(),
              v_cache.data_as<float>() +
                  start_pos * v_cache.shape()[1] * v_cache.shape()[2]);
  return absl::OkStatus();
}

absl::Status CpuOps::Attention(const AttentionArgs& args) {
  RETURN_IF_ERROR(CheckF32("Attention", "q", args.q));
  RETURN_IF_ERROR(CheckF32("Attention", "k_cache", args.k_cache));
  RETURN_IF_ERROR(CheckF32("Attention", "v_cache", args.v_cache));
  RETURN_IF_ERROR(CheckF32("Attention", "out", args.out));
  const Shape& qs = args.q.shape();
  const Shape& ks = args.k_cache.shape();
  const Shape& vs = args.v_cache.shape();
  const Shape& os = args.out.shape();
  if (qs.rank() != 3 || ks.rank() != 3 || vs.rank() != 3 || os.rank() != 3) {
    return absl::InvalidArgumentError(
        "Attention: q, k_cache, v_cache and out must be rank 3");
  }
  const int64_t tokens = qs[0];
  const int64_t num_heads = qs[1];
  const int64_t dim = qs[2];
  const int64_t num_kv_heads = ks[1];
  const int64_t dim_v = vs[2];
  const int64_t kv_len = args.start_pos + tokens;
  if (ks[2] != dim || vs[1] != num_kv_heads || vs[0] != ks[0] ||
      num_kv_heads <= 0 || num_heads % num_kv_heads != 0 ||
      os != Shape({tokens, num_heads, dim_v}) || args.start_pos < 0 ||
      kv_len > ks[0] || args.sliding_window < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention: inconsistent shapes q ", qs.ToString(), ", k_cache ",
        ks.ToString(), ", v_cache ", vs.ToString(), ", out ", os.ToString(),
        " at start_pos ", args.start_pos));
  }
  const int64_t group = num_heads / num_kv_heads;
  const float* q = args.q.data_as<const float>();
  const float* k = args.k_cache.data_as<const float>();
  const float* v = args.v_cache.data_as<const float>();
  float* out = args.out.data_as<float>();
  const int64_t work = tokens * num_heads * kv_len * (dim + dim_v);

#pragma omp parallel if (work > kParallelThreshold)
  {
    // Softmax weights of one (token, head), reused across heads and calls:
    // grows to the longest context once per thread, then a decode step
    // allocates nothing.
    thread_local std::vector<float> weights;
    if (weights.size() < static_cast<size_t>(kv_len)) weights.resize(kv_len);
#pragma omp for collapse(2) schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < num_heads; ++h) {
        const int64_t pos = args.start_pos + t;
        const int64_t first =
            args.sliding_window > 0
                ? std::max<int64_t>(0, pos - args.sliding_window + 1)
                : 0;
        const int64_t kvh = h / group;
        const float* qv = q + (t * num_heads + h) * dim;
        float max_score = -INFINITY;
        for (int64_t s = first; s <= pos; ++s) {
          const float* kv = k + (s * num_kv_heads + kvh) * dim;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < dim; ++i) dot += qv[i] * kv[i];
          const float score = dot * args.scale;
          weights[s - first] = score;
          max_score = std::max(max_score, score);
        }
        float denom = 0.0f;
        for (int64_t s = 0; s <= pos - first; ++s) {
          weights[s] = std::exp(weights[s] - max_score);
          denom += weights[s];
        }
        const float inv_denom = 1.0f / denom;
        float* o = out + (t * num_heads + h) * dim_v;
        std::fill_n(o, dim_v, 0.0f);
        for (int64_t s = first; s <= pos; ++s) {
          const float p = weights[s - first] * inv_denom;
          const float* vv = v + (s * num_kv_heads + kvh) * dim_v;
#pragma omp simd
          for (int64_t i = 0; i < dim_v; ++i) o[i] += p * vv[i];
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
