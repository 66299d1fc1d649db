// The paged KV-cache ops of the CPU backend (StoreKvCache, PrefillAttention,
// DecodeAttention, StaticAttention) against a naive reference written here:
// per sequence, the keys and values of its positions are gathered into
// contiguous arrays, then plain causal softmax attention runs in float64. Every
// case draws fresh random inputs, shuffled block tables and unused cache slots
// filled with NaN, so a kernel that reads a wrong slot fails loudly.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/attention_metadata.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/testing/step_arrays.h"

namespace tessera {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Config {
  int32_t block_size = 16;
  int64_t heads = 8;
  int64_t kv_heads = 2;
  int64_t dim = 32;
  int64_t dim_v = 32;
  int64_t window = 0;
  bool int8 = false;
  bool fp8 = false;      // An e4m3 cache with random per-head scales.
  float softcap = 0.0f;  // 0: none.

  std::string ToString() const {
    return absl::StrCat("block_size=", block_size, " heads=", heads,
                        " kv_heads=", kv_heads, " D=", dim, " Dv=", dim_v,
                        " window=", window, " int8=", int8, " fp8=", fp8,
                        " softcap=", softcap);
  }
  // A scaled score after the optional soft cap (transformers' order).
  double Cap(double score) const {
    return softcap > 0 ? std::tanh(score / softcap) * softcap : score;
  }
};

// The cache kinds the tests run each case over: f32, int8, fp8.
enum class Cache { kF32, kI8, kFp8 };
constexpr Cache kCaches[] = {Cache::kF32, Cache::kI8, Cache::kFp8};
void SetCache(Cache cache, Config* c) {
  c->int8 = cache == Cache::kI8;
  c->fp8 = cache == Cache::kFp8;
}

// (context_len, query_len) of each sequence of a step.
using Lens = std::vector<std::pair<int64_t, int64_t>>;

// One step's inputs: metadata, queries, the original f32 keys and values of
// every position of every sequence, and the cache that holds them.
struct Problem {
  Config config;
  HostAttentionMetadata m;
  AttentionMetadata view;  // Of m, for the ops.
  int64_t num_slots = 0;
  Tensor q;                              // [T, H, D]
  std::vector<std::vector<float>> k, v;  // Per sequence [seq_len, kv, D(v)].
  Tensor k_cache, v_cache, k_scale, v_scale;
  KvCacheLayer layer;

  float scale() const {
    return 1.0f / std::sqrt(static_cast<float>(config.dim));
  }
};

class PagedAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const uint32_t seed = std::random_device{}();
    rng_.seed(seed);
    RecordProperty("seed", std::to_string(seed));
    std::cerr << "seed " << seed << "\n";
  }

  std::vector<float> RandomVector(int64_t n, float stddev = 1.0f) {
    std::normal_distribution<float> dist(0.0f, stddev);
    std::vector<float> out(n);
    for (float& x : out) x = dist(rng_);
    return out;
  }

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  // A random mix of sequences: some decodes, some with no context.
  Lens RandomLens(int n) {
    Lens lens;
    for (int i = 0; i < n; ++i) {
      const int64_t ctx = Uniform(0, 2) == 0 ? 0 : Uniform(1, 45);
      const int64_t qlen = Uniform(0, 2) == 0 ? 1 : Uniform(1, 24);
      lens.push_back({ctx, qlen});
    }
    return lens;
  }

  // Builds the step. Paged: each sequence gets its blocks (plus sometimes a
  // spare one at the end of its table) from a shuffled pool with unused
  // blocks. Static (capacity > 0): block_size = capacity, one block each, in
  // shuffled order.
  Problem Make(const Config& config, const Lens& lens, int64_t capacity = 0) {
    Problem p;
    p.config = config;
    const int32_t bs =
        capacity > 0 ? static_cast<int32_t>(capacity) : config.block_size;
    p.config.block_size = bs;
    std::vector<int64_t> blocks_needed;
    int64_t total_blocks = 3;  // Never handed out.
    for (const auto& [ctx, qlen] : lens) {
      const int64_t n =
          capacity > 0 ? 1 : (ctx + qlen + bs - 1) / bs + Uniform(0, 1);
      blocks_needed.push_back(n);
      total_blocks += n;
    }
    std::vector<int32_t> pool(total_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng_);
    std::vector<std::vector<int32_t>> tables;
    std::vector<SequenceSlice> slices;
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      tables.emplace_back(pool.begin() + next,
                          pool.begin() + next + blocks_needed[s]);
      next += blocks_needed[s];
    }
    for (size_t s = 0; s < lens.size(); ++s) {
      slices.push_back({lens[s].first, lens[s].second, tables[s]});
    }
    auto m = BuildAttentionMetadata(slices, bs, total_blocks);
    EXPECT_TRUE(m.ok()) << m.status();
    p.m = *std::move(m);
    p.view = p.m.View();
    p.num_slots = total_blocks * bs;

    const Config& c = p.config;
    p.q = *Tensor::Empty(DType::kF32, {p.m.num_tokens, c.heads, c.dim});
    const std::vector<float> qv = RandomVector(p.q.numel());
    std::copy(qv.begin(), qv.end(), p.q.data_as<float>());

    const DType dtype = c.int8  ? DType::kI8
                        : c.fp8 ? DType::kF8E4M3
                                : DType::kF32;
    p.k_cache = *Tensor::Empty(dtype, {p.num_slots, c.kv_heads, c.dim});
    p.v_cache = *Tensor::Empty(dtype, {p.num_slots, c.kv_heads, c.dim_v});
    if (c.fp8) {
      // NaN bytes in slots nobody writes; a scale per head, not powers of
      // two (so x / scale rounds), the same for every slot.
      std::memset(p.k_cache.data(), 0x7f, p.k_cache.nbytes());
      std::memset(p.v_cache.data(), 0xff, p.v_cache.nbytes());
      p.k_scale = *Tensor::Empty(DType::kF32, {c.kv_heads});
      p.v_scale = *Tensor::Empty(DType::kF32, {c.kv_heads});
      std::uniform_real_distribution<float> scale(0.2f, 3.0f);
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        p.k_scale.data_as<float>()[h] = scale(rng_);
        p.v_scale.data_as<float>()[h] = scale(rng_);
      }
      p.layer = {p.k_cache.view(), p.v_cache.view(), p.k_scale.view(),
                 p.v_scale.view()};
    } else if (c.int8) {
      // Garbage values and NaN scales in slots nobody writes.
      std::memset(p.k_cache.data(), 0x5a, p.k_cache.nbytes());
      std::memset(p.v_cache.data(), 0xa5, p.v_cache.nbytes());
      p.k_scale = *Tensor::Empty(DType::kF32, {p.num_slots, c.kv_heads});
      p.v_scale = *Tensor::Empty(DType::kF32, {p.num_slots, c.kv_heads});
      std::fill_n(p.k_scale.data_as<float>(), p.k_scale.numel(), kNaN);
      std::fill_n(p.v_scale.data_as<float>(), p.v_scale.numel(), kNaN);
      p.layer = {p.k_cache.view(), p.v_cache.view(), p.k_scale.view(),
                 p.v_scale.view()};
    } else {
      std::fill_n(p.k_cache.data_as<float>(), p.k_cache.numel(), kNaN);
      std::fill_n(p.v_cache.data_as<float>(), p.v_cache.numel(), kNaN);
      p.layer = {p.k_cache.view(), p.v_cache.view(), TensorView(),
                 TensorView()};
    }

    // Every position of every sequence goes into the cache in one call.
    int64_t total = 0;
    for (int32_t s = 0; s < p.m.num_seqs; ++s) total += p.m.seq_lens[s];
    Tensor k_all = *Tensor::Empty(DType::kF32, {total, c.kv_heads, c.dim});
    Tensor v_all = *Tensor::Empty(DType::kF32, {total, c.kv_heads, c.dim_v});
    std::vector<int64_t> slots;
    const int64_t k_row = c.kv_heads * c.dim, v_row = c.kv_heads * c.dim_v;
    for (int32_t s = 0; s < p.m.num_seqs; ++s) {
      const int64_t len = p.m.seq_lens[s];
      p.k.push_back(RandomVector(len * k_row));
      p.v.push_back(RandomVector(len * v_row));
      for (int64_t pos = 0; pos < len; ++pos) {
        std::copy_n(p.k[s].data() + pos * k_row, k_row,
                    k_all.data_as<float>() + slots.size() * k_row);
        std::copy_n(p.v[s].data() + pos * v_row, v_row,
                    v_all.data_as<float>() + slots.size() * v_row);
        slots.push_back(p.m.Slot(s, pos));
      }
    }
    const absl::Status st = ops_.StoreKvCache(k_all.view(), v_all.view(),
                                              StepArray(slots), p.layer);
    EXPECT_TRUE(st.ok()) << st;
    return p;
  }

  // What the cache holds for (sequence, position, kv head), as f32 values:
  // dequantized for an int8 or fp8 cache. Gathered through the block table.
  static std::vector<double> CachedRow(const Problem& p, bool is_k, int32_t s,
                                       int64_t pos, int64_t kvh) {
    const Config& c = p.config;
    const int64_t d = is_k ? c.dim : c.dim_v;
    const int64_t slot = p.m.Slot(s, pos);
    const Tensor& cache = is_k ? p.k_cache : p.v_cache;
    const int64_t base = (slot * c.kv_heads + kvh) * d;
    std::vector<double> row(d);
    if (c.fp8) {
      const double scale = (is_k ? p.k_scale : p.v_scale).data_as<float>()[kvh];
      for (int64_t i = 0; i < d; ++i) {
        row[i] = Fp8E4M3ToF32(cache.data_as<uint8_t>()[base + i]) * scale;
      }
    } else if (c.int8) {
      const double scale = (is_k ? p.k_scale : p.v_scale)
                               .data_as<float>()[slot * c.kv_heads + kvh];
      for (int64_t i = 0; i < d; ++i) {
        row[i] = cache.data_as<int8_t>()[base + i] * scale;
      }
    } else {
      for (int64_t i = 0; i < d; ++i) row[i] = cache.data_as<float>()[base + i];
    }
    return row;
  }

  // Naive attention, [T, H, Dv] in float64. from_cache: keys and values are
  // gathered from the cache through the block tables (dequantized); otherwise
  // the original f32 inputs are used.
  static std::vector<double> Reference(const Problem& p, bool from_cache) {
    const Config& c = p.config;
    const HostAttentionMetadata& m = p.m;
    const int64_t group = c.heads / c.kv_heads;
    std::vector<double> out(m.num_tokens * c.heads * c.dim_v, 0.0);
    for (int32_t s = 0; s < m.num_seqs; ++s) {
      const int64_t len = m.seq_lens[s];
      // Contiguous [len, kv, D] copies of this sequence's keys and values.
      std::vector<double> k(len * c.kv_heads * c.dim);
      std::vector<double> v(len * c.kv_heads * c.dim_v);
      for (int64_t pos = 0; pos < len; ++pos) {
        for (int64_t kvh = 0; kvh < c.kv_heads; ++kvh) {
          for (int is_k = 0; is_k < 2; ++is_k) {
            const int64_t d = is_k ? c.dim : c.dim_v;
            std::vector<double> row;
            if (from_cache) {
              row = CachedRow(p, is_k, s, pos, kvh);
            } else {
              const float* src = (is_k ? p.k[s] : p.v[s]).data() +
                                 (pos * c.kv_heads + kvh) * d;
              row.assign(src, src + d);
            }
            std::copy(row.begin(), row.end(),
                      (is_k ? k : v).begin() + (pos * c.kv_heads + kvh) * d);
          }
        }
      }
      for (int64_t i = 0; i < m.query_len(s); ++i) {
        const int64_t t = m.query_start_loc[s] + i;
        const int64_t pos = m.context_lens[s] + i;
        const int64_t first =
            c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
        for (int64_t h = 0; h < c.heads; ++h) {
          const int64_t kvh = h / group;
          const float* qv = p.q.data_as<float>() + (t * c.heads + h) * c.dim;
          std::vector<double> scores;
          double max_score = -INFINITY;
          for (int64_t j = first; j <= pos; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < c.dim; ++d) {
              dot += qv[d] * k[(j * c.kv_heads + kvh) * c.dim + d];
            }
            scores.push_back(c.Cap(dot * p.scale()));
            max_score = std::max(max_score, scores.back());
          }
          double denom = 0;
          for (double& x : scores) denom += (x = std::exp(x - max_score));
          double* o = out.data() + (t * c.heads + h) * c.dim_v;
          for (int64_t j = first; j <= pos; ++j) {
            const double w = scores[j - first] / denom;
            for (int64_t d = 0; d < c.dim_v; ++d) {
              o[d] += w * v[(j * c.kv_heads + kvh) * c.dim_v + d];
            }
          }
        }
      }
    }
    return out;
  }

  // How far int8 or fp8 quantization can move each output element [T, H, Dv]
  // from
  // the attention of the original f32 keys and values: a bound derived from
  // this problem's own values, not a tolerance guessed from samples. With the
  // logits off by d_j = scale * q . (k~_j - k_j) and e = max_j |d_j|, every
  // probability is within a factor exp(+-2e) of its f32 value p_j, so
  // |o~ - o| <= max_j |v~_j - v_j| + (exp(2e) - 1) * sum_j p_j |v_j|.
  static std::vector<double> QuantizationBound(const Problem& p) {
    const Config& c = p.config;
    const HostAttentionMetadata& m = p.m;
    const int64_t group = c.heads / c.kv_heads;
    std::vector<double> bound(m.num_tokens * c.heads * c.dim_v, 0.0);
    for (int32_t s = 0; s < m.num_seqs; ++s) {
      for (int64_t i = 0; i < m.query_len(s); ++i) {
        const int64_t t = m.query_start_loc[s] + i;
        const int64_t pos = m.context_lens[s] + i;
        const int64_t first =
            c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
        for (int64_t h = 0; h < c.heads; ++h) {
          const int64_t kvh = h / group;
          const float* qv = p.q.data_as<float>() + (t * c.heads + h) * c.dim;
          std::vector<double> scores;
          double max_score = -INFINITY, eps = 0;
          std::vector<double> v_err(c.dim_v, 0.0);
          for (int64_t j = first; j <= pos; ++j) {
            const std::vector<double> kq = CachedRow(p, true, s, j, kvh);
            const std::vector<double> vq = CachedRow(p, false, s, j, kvh);
            const float* k = p.k[s].data() + (j * c.kv_heads + kvh) * c.dim;
            const float* v = p.v[s].data() + (j * c.kv_heads + kvh) * c.dim_v;
            double dot = 0, delta = 0;
            for (int64_t d = 0; d < c.dim; ++d) {
              dot += qv[d] * double{k[d]};
              delta += qv[d] * (kq[d] - k[d]);
            }
            // The cap is 1-Lipschitz: it moves no logit further apart.
            scores.push_back(c.Cap(dot * p.scale()));
            max_score = std::max(max_score, scores.back());
            eps = std::max(eps, std::fabs(delta * p.scale()));
            for (int64_t d = 0; d < c.dim_v; ++d) {
              v_err[d] = std::max(v_err[d], std::fabs(vq[d] - v[d]));
            }
          }
          double denom = 0;
          for (double& x : scores) denom += (x = std::exp(x - max_score));
          double* b = bound.data() + (t * c.heads + h) * c.dim_v;
          for (int64_t d = 0; d < c.dim_v; ++d) {
            double spread = 0;
            for (int64_t j = first; j <= pos; ++j) {
              spread += scores[j - first] / denom *
                        std::fabs(p.v[s][(j * c.kv_heads + kvh) * c.dim_v + d]);
            }
            b[d] = v_err[d] + std::expm1(2 * eps) * spread;
          }
        }
      }
    }
    return bound;
  }

  // Rows of sequences [first, end) are within `bound` (plus f32 rounding) of
  // `want`.
  static void ExpectWithin(const Problem& p, const Tensor& out,
                           const std::vector<double>& want,
                           const std::vector<double>& bound, int32_t first,
                           int32_t end) {
    const int64_t row = p.config.heads * p.config.dim_v;
    for (int32_t s = first; s < end; ++s) {
      for (int64_t t = p.m.query_start_loc[s]; t < p.m.query_start_loc[s + 1];
           ++t) {
        for (int64_t i = t * row; i < (t + 1) * row; ++i) {
          ASSERT_NEAR(out.data_as<float>()[i], want[i],
                      bound[i] + 1e-5 * (1.0 + std::fabs(want[i])))
              << "sequence " << s << " row " << t << " element " << i - t * row
              << " (quantization bound " << bound[i] << ")";
        }
      }
    }
  }

  PagedAttentionArgs Args(const Problem& p, const Tensor& out, int32_t first,
                          int32_t end) {
    PagedAttentionArgs args;
    args.q = p.q.view();
    args.cache = p.layer;
    args.metadata = &p.view;
    args.first_seq = first;
    args.end_seq = end;
    args.out = out.view();
    args.sliding_window = p.config.window;
    args.scale = p.scale();
    args.softcap = p.config.softcap;
    return args;
  }

  Tensor SentinelOut(const Problem& p) {
    Tensor out = *Tensor::Empty(
        DType::kF32, {p.m.num_tokens, p.config.heads, p.config.dim_v});
    std::fill_n(out.data_as<float>(), out.numel(), 12345.0f);
    return out;
  }

  // Rows of sequences [first, end) match `want`; the other rows still hold
  // the sentinel.
  static void ExpectRows(const Problem& p, const Tensor& out,
                         const std::vector<double>& want, int32_t first,
                         int32_t end, double tol) {
    const int64_t row = p.config.heads * p.config.dim_v;
    for (int32_t s = 0; s < p.m.num_seqs; ++s) {
      const bool chosen = s >= first && s < end;
      for (int64_t t = p.m.query_start_loc[s]; t < p.m.query_start_loc[s + 1];
           ++t) {
        for (int64_t i = t * row; i < (t + 1) * row; ++i) {
          const float got = out.data_as<float>()[i];
          if (chosen) {
            ASSERT_NEAR(got, want[i], tol * (1.0 + std::fabs(want[i])))
                << "sequence " << s << " row " << t << " element "
                << i - t * row;
          } else {
            ASSERT_EQ(got, 12345.0f) << "unchosen sequence " << s << " written";
          }
        }
      }
    }
  }

  // Checks PrefillAttention over the whole step, the runtime split (decode
  // kernel on the leading decodes, prefill on the rest) and a sub-range.
  void CheckPaged(const Config& config, const Lens& lens) {
    SCOPED_TRACE(config.ToString());
    Problem p = Make(config, lens);
    const HostAttentionMetadata& m = p.m;
    const std::vector<double> want = Reference(p, /*from_cache=*/true);
    const std::vector<double> want_f32 = Reference(p, /*from_cache=*/false);
    const double tight = 1e-5;

    Tensor out = SentinelOut(p);
    ASSERT_TRUE(ops_.PrefillAttention(Args(p, out, 0, m.num_seqs)).ok());
    ExpectRows(p, out, want, 0, m.num_seqs, tight);
    if (config.int8 || config.fp8) {
      ExpectWithin(p, out, want_f32, QuantizationBound(p), 0, m.num_seqs);
    }

    Tensor split = SentinelOut(p);
    ASSERT_TRUE(
        ops_.DecodeAttention(Args(p, split, 0, m.num_decode_seqs)).ok());
    ASSERT_TRUE(
        ops_.PrefillAttention(Args(p, split, m.num_decode_seqs, m.num_seqs))
            .ok());
    ExpectRows(p, split, want, 0, m.num_seqs, tight);

    if (m.num_seqs >= 3) {
      Tensor part = SentinelOut(p);
      ASSERT_TRUE(ops_.PrefillAttention(Args(p, part, 1, m.num_seqs - 1)).ok());
      ExpectRows(p, part, want, 1, m.num_seqs - 1, tight);
    }
  }

  std::mt19937 rng_;
  CpuOps ops_;
};

TEST_F(PagedAttentionTest, PagedKernelsMatchReference) {
  // Leading decodes (one with no context), a first prefill, chunked prefills
  // and a decode after them.
  const Lens fixed = {{0, 1},  {13, 1}, {40, 1}, {0, 7},
                      {5, 20}, {41, 3}, {0, 33}, {17, 1}};
  const std::vector<std::pair<int64_t, int64_t>> heads = {
      {8, 2}, {4, 1}, {3, 3}};
  const std::vector<std::pair<int64_t, int64_t>> dims = {
      {32, 32}, {20, 20}, {16, 24}};
  int variant = 0;
  for (int32_t block_size : {1, 5, 16}) {
    for (const auto& [h, kv] : heads) {
      for (int64_t window : {0, 6}) {
        for (Cache cache : kCaches) {
          Config c;
          c.block_size = block_size;
          c.heads = h;
          c.kv_heads = kv;
          c.dim = dims[variant % dims.size()].first;
          c.dim_v = dims[variant % dims.size()].second;
          ++variant;
          c.window = window;
          SetCache(cache, &c);
          CheckPaged(c, fixed);
          CheckPaged(c, RandomLens(static_cast<int>(Uniform(1, 7))));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Gemma 2's attention logit soft-capping, with a cap small enough to bind
// (scaled scores here are of order 1): paged (decode and prefill), windows,
// int8 caches, and the static layout.
TEST_F(PagedAttentionTest, SoftcappedKernelsMatchReference) {
  const Lens fixed = {{0, 1}, {13, 1}, {40, 1}, {0, 7}, {5, 20}, {41, 3}};
  for (int32_t block_size : {1, 16}) {
    for (int64_t window : {0, 6}) {
      for (Cache cache : kCaches) {
        Config c;
        c.block_size = block_size;
        c.heads = 4;
        c.kv_heads = 2;
        c.dim = c.dim_v = 16;
        c.window = window;
        SetCache(cache, &c);
        c.softcap = 0.75f;
        CheckPaged(c, fixed);
        CheckPaged(c, RandomLens(static_cast<int>(Uniform(1, 7))));
        if (HasFatalFailure()) return;
      }
    }
  }
  Config c;
  c.heads = 8;
  c.kv_heads = 2;
  c.dim = c.dim_v = 32;
  c.window = 9;
  c.softcap = 0.5f;
  SCOPED_TRACE(c.ToString() + " static");
  Problem p = Make(c, {{0, 1}, {30, 1}, {0, 48}, {12, 9}}, /*capacity=*/48);
  Tensor out = SentinelOut(p);
  ASSERT_TRUE(ops_.StaticAttention(Args(p, out, 0, p.m.num_seqs)).ok());
  ExpectRows(p, out, Reference(p, /*from_cache=*/true), 0, p.m.num_seqs, 1e-5);
  // The cap changes the result (it binds).
  p.config.softcap = 0.0f;
  const std::vector<double> plain = Reference(p, /*from_cache=*/true);
  double moved = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    moved = std::max(moved, std::fabs(out.data_as<float>()[i] - plain[i]));
  }
  EXPECT_GT(moved, 1e-2);
}

TEST_F(PagedAttentionTest, DecodeMatchesReference) {
  for (Cache cache : kCaches) {
    for (int32_t block_size : {1, 5, 16}) {
      Config c;
      c.block_size = block_size;
      c.heads = 8;
      c.kv_heads = 2;
      c.dim = c.dim_v = 64;
      SetCache(cache, &c);
      SCOPED_TRACE(c.ToString());
      Lens lens;
      for (int64_t ctx : {0, 1, 4, 5, 15, 16, 17, 100, 250}) {
        lens.push_back({ctx, 1});
      }
      std::shuffle(lens.begin(), lens.end(), rng_);
      Problem p = Make(c, lens);
      ASSERT_EQ(p.m.num_decode_seqs, p.m.num_seqs);
      Tensor out = SentinelOut(p);
      ASSERT_TRUE(ops_.DecodeAttention(Args(p, out, 0, p.m.num_seqs)).ok());
      ExpectRows(p, out, Reference(p, /*from_cache=*/true), 0, p.m.num_seqs,
                 1e-5);
      if (cache != Cache::kF32) {
        ExpectWithin(p, out, Reference(p, /*from_cache=*/false),
                     QuantizationBound(p), 0, p.m.num_seqs);
      }
    }
  }
}

// A sequence's decode result must not depend on the rest of the batch (nor on
// whether the batch was large enough to run on several threads).
TEST_F(PagedAttentionTest, DecodeIsBatchInvariant) {
  for (Cache cache : kCaches) {
    Config c;
    c.block_size = 16;
    c.heads = 8;
    c.kv_heads = 2;
    c.dim = c.dim_v = 16;
    SetCache(cache, &c);
    SCOPED_TRACE(c.ToString());
    Lens lens;
    for (int i = 0; i < 16; ++i) lens.push_back({Uniform(0, 200), 1});
    Problem p = Make(c, lens);
    Tensor batch_out = SentinelOut(p);
    ASSERT_TRUE(ops_.DecodeAttention(Args(p, batch_out, 0, 16)).ok());
    const int64_t row = c.heads * c.dim_v;
    for (int32_t s = 0; s < 16; ++s) {
      // The same sequence alone: its own metadata, query and block table,
      // over the same cache.
      const int32_t* table = p.m.block_table(s);
      const int64_t table_len =
          std::find(table, table + p.m.max_blocks_per_seq, -1) - table;
      SequenceSlice slice{p.m.context_lens[s], 1,
                          absl::MakeConstSpan(table, table_len)};
      const HostAttentionMetadata alone_host = *BuildAttentionMetadata(
          {slice}, c.block_size, p.num_slots / c.block_size);
      const AttentionMetadata alone = alone_host.View();
      Tensor q = *Tensor::Empty(DType::kF32, {1, c.heads, c.dim});
      std::copy_n(p.q.data_as<float>() + s * c.heads * c.dim, c.heads * c.dim,
                  q.data_as<float>());
      Tensor out = *Tensor::Empty(DType::kF32, {1, c.heads, c.dim_v});
      PagedAttentionArgs args = Args(p, out, 0, 1);
      args.q = q.view();
      args.metadata = &alone;
      ASSERT_TRUE(ops_.DecodeAttention(args).ok());
      EXPECT_EQ(std::memcmp(out.data(), batch_out.data_as<float>() + s * row,
                            row * sizeof(float)),
                0)
          << "sequence " << s;
    }
  }
}

TEST_F(PagedAttentionTest, StaticMatchesPrefillAndReference) {
  for (Cache cache : kCaches) {
    for (int64_t window : {0, 9}) {
      Config c;
      c.heads = 8;
      c.kv_heads = 2;
      c.dim = c.dim_v = 32;
      c.window = window;
      SetCache(cache, &c);
      SCOPED_TRACE(c.ToString());
      const Lens lens = {{0, 1}, {30, 1}, {0, 48}, {12, 9}, {47, 1}};
      Problem p = Make(c, lens, /*capacity=*/48);
      Tensor static_out = SentinelOut(p);
      ASSERT_TRUE(
          ops_.StaticAttention(Args(p, static_out, 0, p.m.num_seqs)).ok());
      Tensor paged_out = SentinelOut(p);
      ASSERT_TRUE(
          ops_.PrefillAttention(Args(p, paged_out, 0, p.m.num_seqs)).ok());
      for (int64_t i = 0; i < static_out.numel(); ++i) {
        ASSERT_NEAR(static_out.data_as<float>()[i],
                    paged_out.data_as<float>()[i],
                    1e-6 * (1 + std::fabs(paged_out.data_as<float>()[i])))
            << i;
      }
      ExpectRows(p, static_out, Reference(p, /*from_cache=*/true), 0,
                 p.m.num_seqs, 1e-5);
      // A sub-range only writes its rows.
      Tensor part = SentinelOut(p);
      ASSERT_TRUE(ops_.StaticAttention(Args(p, part, 2, 4)).ok());
      ExpectRows(p, part, Reference(p, /*from_cache=*/true), 2, 4, 1e-5);
    }
  }
}

TEST_F(PagedAttentionTest, StoreKvCacheInt8RoundTrip) {
  const int64_t tokens = 6, kv = 3, dim = 40, dim_v = 24, slots = 20;
  std::vector<float> k = RandomVector(tokens * kv * dim, 3.0f);
  std::vector<float> v = RandomVector(tokens * kv * dim_v, 0.01f);
  // Token 2, head 1: an all-zero row in k and v.
  std::fill_n(k.begin() + (2 * kv + 1) * dim, dim, 0.0f);
  std::fill_n(v.begin() + (2 * kv + 1) * dim_v, dim_v, 0.0f);
  TensorView kt(k.data(), DType::kF32, {tokens, kv, dim});
  TensorView vt(v.data(), DType::kF32, {tokens, kv, dim_v});
  Tensor kc = *Tensor::Zeros(DType::kI8, {slots, kv, dim});
  Tensor vc = *Tensor::Zeros(DType::kI8, {slots, kv, dim_v});
  Tensor ks = *Tensor::Empty(DType::kF32, {slots, kv});
  Tensor vs = *Tensor::Empty(DType::kF32, {slots, kv});
  std::fill_n(ks.data_as<float>(), ks.numel(), -1.0f);
  std::fill_n(vs.data_as<float>(), vs.numel(), -1.0f);
  const KvCacheLayer layer{kc.view(), vc.view(), ks.view(), vs.view()};
  const std::vector<int64_t> slot_mapping = {7, 0, 19, 3, 12, 8};
  ASSERT_TRUE(ops_.StoreKvCache(kt, vt, StepArray(slot_mapping), layer).ok());

  for (int is_k = 0; is_k < 2; ++is_k) {
    const int64_t d = is_k ? dim : dim_v;
    const std::vector<float>& src = is_k ? k : v;
    const int8_t* q = (is_k ? kc : vc).data_as<int8_t>();
    const float* sc = (is_k ? ks : vs).data_as<float>();
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < kv; ++h) {
        const float* x = src.data() + (t * kv + h) * d;
        const int64_t slot = slot_mapping[t];
        const float scale = sc[slot * kv + h];
        const int8_t* qr = q + (slot * kv + h) * d;
        float amax = 0;
        for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(x[i]));
        if (t == 2 && h == 1) {
          EXPECT_EQ(scale, 0.0f);
          for (int64_t i = 0; i < d; ++i) EXPECT_EQ(qr[i], 0);
          continue;
        }
        EXPECT_FLOAT_EQ(scale, amax / 127.0f);
        int max_q = 0;
        for (int64_t i = 0; i < d; ++i) {
          max_q = std::max(max_q, std::abs(int{qr[i]}));
          EXPECT_LE(std::fabs(x[i] - qr[i] * scale), scale * 0.5f * 1.0001f)
              << "token " << t << " head " << h << " element " << i;
        }
        EXPECT_EQ(max_q, 127);
      }
    }
  }
  // Slots nobody wrote keep their scales.
  EXPECT_EQ(ks.data_as<float>()[1 * kv], -1.0f);

  // An out-of-range slot fails before anything is written.
  Tensor kc2 = *Tensor::Zeros(DType::kI8, {slots, kv, dim});
  const KvCacheLayer layer2{kc2.view(), vc.view(), ks.view(), vs.view()};
  for (int64_t bad : {int64_t{-1}, slots}) {
    std::vector<int64_t> bad_mapping = {1, 2, 3, 4, 5, bad};
    const absl::Status st =
        ops_.StoreKvCache(kt, vt, StepArray(bad_mapping), layer2);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("StoreKvCache"), absl::string_view::npos);
  }
  for (int64_t i = 0; i < kc2.numel(); ++i) {
    ASSERT_EQ(kc2.data_as<int8_t>()[i], 0);
  }
}

TEST_F(PagedAttentionTest, StoreKvCacheF32CopiesRows) {
  const int64_t tokens = 3, kv = 2, dim = 8, slots = 5;
  std::vector<float> k = RandomVector(tokens * kv * dim);
  std::vector<float> v = RandomVector(tokens * kv * dim);
  Tensor kc = *Tensor::Zeros(DType::kF32, {slots, kv, dim});
  Tensor vc = *Tensor::Zeros(DType::kF32, {slots, kv, dim});
  const std::vector<int64_t> slot_mapping = {4, 0, 2};
  ASSERT_TRUE(ops_.StoreKvCache(TensorView(k.data(), DType::kF32, {3, 2, 8}),
                                TensorView(v.data(), DType::kF32, {3, 2, 8}),
                                StepArray(slot_mapping), {kc.view(), vc.view()})
                  .ok());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < kv * dim; ++i) {
      EXPECT_EQ(kc.data_as<float>()[slot_mapping[t] * kv * dim + i],
                k[t * kv * dim + i]);
      EXPECT_EQ(vc.data_as<float>()[slot_mapping[t] * kv * dim + i],
                v[t * kv * dim + i]);
    }
  }
}

// An fp8 cache stores exactly F32ToFp8E4M3(x / scale[head]) per element:
// round to nearest even, values beyond ±448 * scale saturated. Slots nobody
// writes keep their bytes; the scales are read, never written.
TEST_F(PagedAttentionTest, StoreKvCacheFp8RoundTrip) {
  const int64_t tokens = 7, kv = 3, dim = 40, dim_v = 24, slots = 20;
  std::vector<float> k = RandomVector(tokens * kv * dim, 50.0f);
  std::vector<float> v = RandomVector(tokens * kv * dim_v, 0.01f);
  // Saturation, both signs, the largest finite value and its neighbours,
  // zeros of both signs, subnormal results.
  const float specials[] = {1e6f,   -1e6f,  448.0f, -448.0f, 464.0f,
                            480.0f, 0.0f,   -0.0f,  1e-3f,   -2e-3f,
                            1e-30f, 447.9f, 250.0f, -0.5f,   3.4e38f};
  for (size_t i = 0; i < std::size(specials); ++i) k[i * 3] = specials[i];
  TensorView kt(k.data(), DType::kF32, {tokens, kv, dim});
  TensorView vt(v.data(), DType::kF32, {tokens, kv, dim_v});
  Tensor kc = *Tensor::Empty(DType::kF8E4M3, {slots, kv, dim});
  Tensor vc = *Tensor::Empty(DType::kF8E4M3, {slots, kv, dim_v});
  std::memset(kc.data(), 0x11, kc.nbytes());
  std::memset(vc.data(), 0x22, vc.nbytes());
  Tensor ks = *Tensor::Empty(DType::kF32, {kv});
  Tensor vs = *Tensor::Empty(DType::kF32, {kv});
  const float k_scales[] = {1.0f, 0.37f, 2.5f};
  const float v_scales[] = {1e-4f, 1.0f, 0.013f};
  std::copy_n(k_scales, kv, ks.data_as<float>());
  std::copy_n(v_scales, kv, vs.data_as<float>());
  const KvCacheLayer layer{kc.view(), vc.view(), ks.view(), vs.view()};
  const std::vector<int64_t> slot_mapping = {7, 0, 19, 3, 12, 8, 1};
  ASSERT_TRUE(ops_.StoreKvCache(kt, vt, StepArray(slot_mapping), layer).ok());

  int saturated = 0;
  for (int is_k = 0; is_k < 2; ++is_k) {
    const int64_t d = is_k ? dim : dim_v;
    const std::vector<float>& src = is_k ? k : v;
    const uint8_t* q = (is_k ? kc : vc).data_as<uint8_t>();
    const float* sc = is_k ? k_scales : v_scales;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < kv; ++h) {
        const float* x = src.data() + (t * kv + h) * d;
        const uint8_t* qr = q + (slot_mapping[t] * kv + h) * d;
        for (int64_t i = 0; i < d; ++i) {
          ASSERT_EQ(qr[i], F32ToFp8E4M3(x[i] / sc[h]))
              << (is_k ? "k" : "v") << " token " << t << " head " << h
              << " element " << i << " value " << x[i];
          saturated += (qr[i] & 0x7f) == 0x7e;
        }
      }
    }
  }
  EXPECT_GE(saturated, 5);  // The specials beyond 448 at least.
  // k[0] is token 0's head 0 (scale 1), in slot 7.
  EXPECT_EQ(kc.data_as<uint8_t>()[slot_mapping[0] * kv * dim], 0x7e);
  EXPECT_EQ(F32ToFp8E4M3(1e6f), 0x7e);  // 448: saturated, never NaN.
  // Unwritten slots and the scales are untouched.
  for (int64_t slot : {2, 4, 5, 6, 9, 10, 11, 13, 14, 15, 16, 17, 18}) {
    for (int64_t i = 0; i < kv * dim; ++i) {
      ASSERT_EQ(kc.data_as<uint8_t>()[slot * kv * dim + i], 0x11) << slot;
    }
  }
  EXPECT_EQ(ks.data_as<float>()[1], 0.37f);
  EXPECT_EQ(vs.data_as<float>()[2], 0.013f);
}

// Attention over an fp8 cache is attention over an f32 cache holding the
// dequantized values, F32 math on the same numbers: the only differences are
// where the scale enters the sums (q·k_q times k_scale * scale against
// q·(k_q k_scale) times scale, and p v_scale times v_q against p times v_q
// v_scale), a few f32 roundings, so 1e-5 relative. Every cache byte is a
// random code (all 254 finite ones occur), the scales random per head.
TEST_F(PagedAttentionTest, Fp8CacheEqualsF32CacheOfItsValues) {
  for (int64_t window : {0, 7}) {
    Config c;
    c.block_size = 5;
    c.heads = 6;
    c.kv_heads = 3;
    c.dim = 32;
    c.dim_v = 24;
    c.window = window;
    c.fp8 = true;
    c.softcap = window > 0 ? 2.0f : 0.0f;
    SCOPED_TRACE(c.ToString());
    Problem p = Make(c, {{0, 1}, {13, 1}, {40, 1}, {0, 9}, {5, 20}, {41, 3}});
    // Scores of order 1 for values up to 448 * 3.
    for (int64_t i = 0; i < p.q.numel(); ++i) p.q.data_as<float>()[i] *= 2e-3f;
    std::uniform_int_distribution<int> byte(0, 255);
    Tensor kf = *Tensor::Empty(DType::kF32, p.k_cache.shape());
    Tensor vf = *Tensor::Empty(DType::kF32, p.v_cache.shape());
    std::vector<bool> seen(256, false);
    for (int is_k = 0; is_k < 2; ++is_k) {
      Tensor& cache = is_k ? p.k_cache : p.v_cache;
      Tensor& values = is_k ? kf : vf;
      const float* scale = (is_k ? p.k_scale : p.v_scale).data_as<float>();
      const int64_t d = is_k ? c.dim : c.dim_v;
      for (int64_t i = 0; i < cache.numel(); ++i) {
        uint8_t b = 0;
        do {
          b = static_cast<uint8_t>(byte(rng_));
        } while ((b & 0x7f) == 0x7f);  // NaN.
        seen[b] = true;
        cache.data_as<uint8_t>()[i] = b;
        values.data_as<float>()[i] =
            Fp8E4M3ToF32(b) * scale[(i / d) % c.kv_heads];
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 254);
    // The same step over the dequantized f32 cache.
    const KvCacheLayer f32{kf.view(), vf.view(), TensorView(), TensorView()};
    const std::vector<double> want = Reference(p, /*from_cache=*/true);
    for (int kind = 0; kind < 2; ++kind) {
      Tensor a = SentinelOut(p), b = SentinelOut(p);
      const int32_t decodes = p.m.num_decode_seqs;
      const int32_t end = kind == 0 ? p.m.num_seqs : decodes;
      PagedAttentionArgs over_f32 = Args(p, b, 0, end);
      over_f32.cache = f32;
      if (kind == 0) {
        ASSERT_TRUE(ops_.PrefillAttention(Args(p, a, 0, end)).ok());
        ASSERT_TRUE(ops_.PrefillAttention(over_f32).ok());
      } else {
        ASSERT_TRUE(ops_.DecodeAttention(Args(p, a, 0, end)).ok());
        ASSERT_TRUE(ops_.DecodeAttention(over_f32).ok());
      }
      std::vector<double> got_f32(b.numel());
      for (int64_t i = 0; i < b.numel(); ++i)
        got_f32[i] = b.data_as<float>()[i];
      // The fp8 loops multiply the per-head scale into each q·k sum (and each
      // probability) instead of into every cached element: the same math,
      // reassociated. The cache holds every e4m3 code (values up to 448 x
      // scale), so under a soft cap f32's reordered rounding reaches a few
      // 1e-5 (3.1e-5 seen): 1e-4 relative, still far below one e4m3 step.
      ExpectRows(p, a, got_f32, 0, end, 1e-4);
      // And both are the float64 attention of those values.
      ExpectRows(p, a, want, 0, end, 1e-4);
    }
  }
  // The static layout too.
  Config c;
  c.heads = 4;
  c.kv_heads = 2;
  c.dim = c.dim_v = 16;
  c.fp8 = true;
  Problem p = Make(c, {{0, 1}, {30, 1}, {0, 24}, {12, 9}}, /*capacity=*/32);
  Tensor kf = *Tensor::Empty(DType::kF32, p.k_cache.shape());
  Tensor vf = *Tensor::Empty(DType::kF32, p.v_cache.shape());
  for (int is_k = 0; is_k < 2; ++is_k) {
    const Tensor& cache = is_k ? p.k_cache : p.v_cache;
    const float* scale = (is_k ? p.k_scale : p.v_scale).data_as<float>();
    for (int64_t i = 0; i < cache.numel(); ++i) {
      (is_k ? kf : vf).data_as<float>()[i] =
          Fp8E4M3ToF32(cache.data_as<uint8_t>()[i]) *
          scale[(i / c.dim) % c.kv_heads];
    }
  }
  Tensor a = SentinelOut(p), b = SentinelOut(p);
  PagedAttentionArgs over_f32 = Args(p, b, 0, p.m.num_seqs);
  over_f32.cache = {kf.view(), vf.view(), TensorView(), TensorView()};
  ASSERT_TRUE(ops_.StaticAttention(Args(p, a, 0, p.m.num_seqs)).ok());
  ASSERT_TRUE(ops_.StaticAttention(over_f32).ok());
  std::vector<double> got_f32(b.numel());
  for (int64_t i = 0; i < b.numel(); ++i) got_f32[i] = b.data_as<float>()[i];
  ExpectRows(p, a, got_f32, 0, p.m.num_seqs, 1e-5);
}

// The per-head scales enter where the contract says, and only for their
// head: over the same bytes, k_scale 2 is the attention scale doubled and
// v_scale 2 doubles the output, both bit for bit (a factor of 2 rounds
// nothing); a head whose scales did not change gives the same bits.
TEST_F(PagedAttentionTest, Fp8ScalesMatterAsPredicted) {
  Config c;
  c.block_size = 4;
  c.heads = 4;
  c.kv_heads = 2;
  c.dim = c.dim_v = 16;
  c.fp8 = true;
  SCOPED_TRACE(c.ToString());
  Problem p = Make(c, {{0, 1}, {9, 1}, {33, 1}, {0, 6}, {7, 11}});
  std::fill_n(p.k_scale.data_as<float>(), 2, 1.0f);
  std::fill_n(p.v_scale.data_as<float>(), 2, 1.0f);
  const int32_t n = p.m.num_seqs;
  Tensor base = SentinelOut(p);
  ASSERT_TRUE(ops_.PrefillAttention(Args(p, base, 0, n)).ok());

  // k_scale of KV head 1 = 2: query heads 2, 3 as with the attention scale
  // doubled; heads 0, 1 unchanged.
  p.k_scale.data_as<float>()[1] = 2.0f;
  Tensor k2 = SentinelOut(p);
  ASSERT_TRUE(ops_.PrefillAttention(Args(p, k2, 0, n)).ok());
  p.k_scale.data_as<float>()[1] = 1.0f;
  Tensor scaled = SentinelOut(p);
  PagedAttentionArgs doubled = Args(p, scaled, 0, n);
  doubled.scale = 2.0f * p.scale();
  ASSERT_TRUE(ops_.PrefillAttention(doubled).ok());
  // v_scale of KV head 0 = 2: query heads 0, 1 exactly twice the base.
  p.v_scale.data_as<float>()[0] = 2.0f;
  Tensor v2 = SentinelOut(p);
  ASSERT_TRUE(ops_.PrefillAttention(Args(p, v2, 0, n)).ok());

  const int64_t dv = c.dim_v;
  double k_moved = 0;
  for (int64_t t = 0; t < p.m.num_tokens; ++t) {
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t d = 0; d < dv; ++d) {
        const int64_t i = (t * c.heads + h) * dv + d;
        const float b = base.data_as<float>()[i];
        if (h < 2) {
          ASSERT_EQ(k2.data_as<float>()[i], b) << "t " << t << " h " << h;
          ASSERT_EQ(v2.data_as<float>()[i], 2.0f * b)
              << "t " << t << " h " << h;
        } else {
          ASSERT_EQ(k2.data_as<float>()[i], scaled.data_as<float>()[i])
              << "t " << t << " h " << h;
          ASSERT_EQ(v2.data_as<float>()[i], b) << "t " << t << " h " << h;
          k_moved =
              std::max<double>(k_moved, std::fabs(k2.data_as<float>()[i] - b));
        }
      }
    }
  }
  EXPECT_GT(k_moved, 1e-3);  // Sharper attention moved the outputs.
}

TEST_F(PagedAttentionTest, RejectsBadInputs) {
  Config c;
  c.block_size = 4;
  c.heads = 4;
  c.kv_heads = 2;
  c.dim = c.dim_v = 8;
  c.int8 = true;
  Problem p = Make(c, {{3, 1}, {0, 2}, {5, 4}});
  Tensor out = SentinelOut(p);
  auto expect_invalid = [](const absl::Status& st, absl::string_view op) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(op), absl::string_view::npos) << st;
  };

  const TensorView kAbsent;

  // The decode kernel on a sequence with query_len 2.
  expect_invalid(ops_.DecodeAttention(Args(p, out, 0, 2)), "DecodeAttention");
  EXPECT_TRUE(ops_.DecodeAttention(Args(p, out, 0, 1)).ok());

  // int8 cache without scales.
  PagedAttentionArgs args = Args(p, out, 0, 3);
  args.cache.k_scale = kAbsent;
  expect_invalid(ops_.PrefillAttention(args), "PrefillAttention");
  expect_invalid(ops_.DecodeAttention(args), "DecodeAttention");
  expect_invalid(ops_.StaticAttention(args), "StaticAttention");
  Tensor k_in = *Tensor::Zeros(DType::kF32, {1, 2, 8});
  expect_invalid(
      ops_.StoreKvCache(k_in.view(), k_in.view(),
                        StepArray(std::vector<int64_t>{0}), args.cache),
      "StoreKvCache");

  // f32 cache given scales.
  Tensor kf = *Tensor::Zeros(DType::kF32, {p.num_slots, 2, 8});
  args = Args(p, out, 0, 3);
  args.cache.k = kf.view();
  args.cache.v = kf.view();
  expect_invalid(ops_.PrefillAttention(args), "PrefillAttention");
  // Mixed dtypes.
  args.cache.k_scale = kAbsent;
  args.cache.v_scale = kAbsent;
  args.cache.v = p.v_cache.view();
  expect_invalid(ops_.PrefillAttention(args), "PrefillAttention");

  // Sequence range.
  expect_invalid(ops_.PrefillAttention(Args(p, out, 0, 4)), "PrefillAttention");
  expect_invalid(ops_.PrefillAttention(Args(p, out, 2, 1)), "PrefillAttention");
  expect_invalid(ops_.PrefillAttention(Args(p, out, -1, 1)),
                 "PrefillAttention");
  // No metadata.
  args = Args(p, out, 0, 3);
  args.metadata = nullptr;
  expect_invalid(ops_.PrefillAttention(args), "PrefillAttention");

  // q / out rows differ from num_tokens; heads not a multiple of kv heads;
  // head dimension differs from the cache's.
  Tensor q_short = *Tensor::Zeros(DType::kF32, {p.m.num_tokens - 1, 4, 8});
  args = Args(p, out, 0, 3);
  args.q = q_short.view();
  expect_invalid(ops_.PrefillAttention(args), "PrefillAttention");
  Tensor out_long = *Tensor::Zeros(DType::kF32, {p.m.num_tokens + 1, 4, 8});
  args = Args(p, out_long, 0, 3);
  expect_invalid(ops_.PrefillAttention(args), "PrefillAttention");
  Tensor q3 = *Tensor::Zeros(DType::kF32, {p.m.num_tokens, 3, 8});
  Tensor out3 = *Tensor::Zeros(DType::kF32, {p.m.num_tokens, 3, 8});
  args = Args(p, out3, 0, 3);
  args.q = q3.view();
  expect_invalid(ops_.PrefillAttention(args), "PrefillAttention");
  Tensor q_dim = *Tensor::Zeros(DType::kF32, {p.m.num_tokens, 4, 16});
  args = Args(p, out, 0, 3);
  args.q = q_dim.view();
  expect_invalid(ops_.PrefillAttention(args), "PrefillAttention");

  // Block ids checked against more blocks than the cache holds (the ids
  // themselves are checked once per step, when the metadata is packed).
  AttentionMetadata bad_view = p.view;
  bad_view.num_blocks = p.num_slots / 4 + 1;
  args = Args(p, out, 0, 3);
  args.metadata = &bad_view;
  expect_invalid(ops_.PrefillAttention(args), "PrefillAttention");
  args.end_seq = 1;
  expect_invalid(ops_.DecodeAttention(args), "DecodeAttention");
  // Metadata nobody checked.
  bad_view.num_blocks = 0;
  expect_invalid(ops_.DecodeAttention(args), "DecodeAttention");

  // Static layout: a sequence longer than its block.
  args = Args(p, out, 0, 3);
  expect_invalid(ops_.StaticAttention(args), "StaticAttention");

  // StoreKvCache: k rows disagree with the slot mapping.
  Tensor k2 = *Tensor::Zeros(DType::kF32, {2, 2, 8});
  expect_invalid(ops_.StoreKvCache(k2.view(), k2.view(),
                                   StepArray(std::vector<int64_t>{0}), p.layer),
                 "StoreKvCache");
}

}  // namespace
}  // namespace tessera
