#include "kernels/cpu/cpu_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_threads.h"
#include "kernels/op_checks.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// Attention work (in multiply-adds) below which threads cost more than they
// save.
constexpr int64_t kParallelThreshold = 1 << 16;
// Multiply-adds below which a matrix product runs on one thread.
constexpr int64_t kBlasParallelThreshold = int64_t{1} << 23;
// A split matrix product runs as slices of output features (rows of the
// weight), each one OpenBLAS call on one thread. Every slice starts on a
// multiple of this, the same micro-kernel tile boundary as in the whole
// product (OpenBLAS's sgemm/sgemv tiles are at most 16 wide)...
constexpr int64_t kBlasSliceAlign = 64;
// ...and holds at least this many multiply-adds, so OpenBLAS never takes its
// small-matrix path for it (on AVX-512 cores, sgemm products of up to 10^6
// multiply-adds: measured, slices of ~10^6 differed in the last bit). An
// output element is then computed by the same kernel code in the same order
// as in one single-threaded call over the whole product: bit for bit the same
// result, whatever the number of threads (cpu_ops_test). Small enough that a
// thread the OS is slow to run holds up little.
constexpr int64_t kBlasSliceWork = int64_t{1} << 21;

// Who runs the threads of a large matrix product. OpenBLAS (the pthreads
// build Debian ships) keeps a thread pool of its own, which busy-waits after
// its work: next to the pool that runs attention, on a 2-core machine, the
// two fought over the second core (a decode step at a 1000-token context took
// 30 ms instead of 3). So by default every product runs as slices on one
// OpenBLAS thread each, spread over CpuThreadPool: one pool, as many threads
// as cores. A user who sets OPENBLAS_NUM_THREADS (or GOTO_NUM_THREADS)
// chooses OpenBLAS's threading instead, as before; OMP_NUM_THREADS sizes the
// one pool.
struct BlasThreading {
  bool openblas_threads = false;  // Large products use OpenBLAS's pool.
  int max_threads = 1;            // That pool's size, when it is used.
};

bool EnvSet(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

const BlasThreading& GetBlasThreading() {
  static const BlasThreading threading = [] {
    BlasThreading t;
    t.openblas_threads =
        EnvSet("OPENBLAS_NUM_THREADS") || EnvSet("GOTO_NUM_THREADS");
    t.max_threads = openblas_get_num_threads();
    // Set once, before any concurrent use (ranks run as threads in tests).
    if (!t.openblas_threads) openblas_set_num_threads(1);
    return t;
  }();
  return threading;
}

// out[:, begin:end] = x * weight[begin:end, :]^T on the calling thread's
// OpenBLAS call (out has row stride n).
void LinearSlice(const float* x, const float* weight, int64_t t, int64_t k,
                 int64_t n, int64_t begin, int64_t end, float* out) {
  if (t == 1) {
    // A single token is a matrix-vector product: gemv streams the weight once.
    cblas_sgemv(CblasRowMajor, CblasNoTrans, end - begin, k, 1.0f,
                weight + begin * k, k, x, 1, 0.0f, out + begin, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, end - begin, k,
                1.0f, x, k, weight + begin * k, k, 0.0f, out + begin, n);
  }
}

absl::Status CheckF32(absl::string_view op, absl::string_view name,
                      const TensorView& t) {
  return CheckDType(op, name, t, DType::kF32);
}

// ---------------------------------------------------------------------------
// Paged KV cache helpers.

// Dimensions of a validated KvCacheLayer.
struct CacheDims {
  int64_t num_slots = 0;
  int64_t num_kv_heads = 0;
  int64_t dim = 0;
  int64_t dim_v = 0;
  bool quantized = false;
};

// A view that stands for "no tensor" (the scales of an f32 cache).
bool IsAbsent(const TensorView& t) {
  return t.data() == nullptr || t.numel() == 0;
}

absl::Status CheckStorage(absl::string_view op, absl::string_view name,
                          const TensorView& t) {
  if (t.data() == nullptr && t.numel() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " has no storage"));
  }
  return absl::OkStatus();
}

// k [S, kv_heads, D] and v [S, kv_heads, Dv], both f32 (scales absent) or
// both int8 (scales f32 [S, kv_heads]).
absl::Status CheckCache(absl::string_view op, const KvCacheLayer& cache,
                        CacheDims* dims) {
  const Shape& ks = cache.k.shape();
  const Shape& vs = cache.v.shape();
  if (ks.rank() != 3 || vs.rank() != 3 || ks[0] != vs[0] || ks[1] != vs[1] ||
      ks[1] <= 0) {
    return ShapeError(op,
                      "cache k [S, kv_heads, D] and v [S, kv_heads, Dv] "
                      "disagree",
                      ks, vs);
  }
  if (cache.k.dtype() != cache.v.dtype() ||
      (cache.k.dtype() != DType::kF32 && cache.k.dtype() != DType::kI8)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": cache k and v must both be f32 or both int8, got ",
        DTypeName(cache.k.dtype()), " and ", DTypeName(cache.v.dtype())));
  }
  RETURN_IF_ERROR(CheckStorage(op, "cache k", cache.k));
  RETURN_IF_ERROR(CheckStorage(op, "cache v", cache.v));
  dims->num_slots = ks[0];
  dims->num_kv_heads = ks[1];
  dims->dim = ks[2];
  dims->dim_v = vs[2];
  dims->quantized = cache.quantized();
  if (dims->quantized) {
    if (IsAbsent(cache.k_scale) || IsAbsent(cache.v_scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": an int8 cache needs k_scale and v_scale"));
    }
    RETURN_IF_ERROR(CheckF32(op, "cache k_scale", cache.k_scale));
    RETURN_IF_ERROR(CheckF32(op, "cache v_scale", cache.v_scale));
    const Shape want({ks[0], ks[1]});
    if (cache.k_scale.shape() != want || cache.v_scale.shape() != want) {
      return ShapeError(op, "cache scales must be [S, kv_heads]",
                        cache.k_scale.shape(), cache.v_scale.shape());
    }
  } else if (!IsAbsent(cache.k_scale) || !IsAbsent(cache.v_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": an f32 cache takes no k_scale / v_scale"));
  }
  return absl::OkStatus();
}

// Symmetric int8 quantization of one row: scale = max|x| / 127 (0 for an
// all-zero row), values rounded to nearest.
void QuantizeRow(const float* x, int64_t n, int8_t* q, float* scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (!(amax > 0.0f)) {
    *scale = 0.0f;
    std::fill_n(q, n, int8_t{0});
    return;
  }
  const float s = amax / 127.0f;
  *scale = s;
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(x[i] / s);
    q[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
  }
}

// sum_i a[i] * b[i] in f32 with a fixed association (kLanes partial sums by
// index, then a fixed tree), so the result depends only on the values: not on
// addresses, threads or the rest of the batch.
template <typename T>
inline float Dot(const float* a, const T* b, int64_t n) {
  if (n < 16) {
    // Small heads (the demo's D = 8): four partial sums, same order always.
    float acc[4] = {};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      for (int j = 0; j < 4; ++j) {
        acc[j] += a[i + j] * static_cast<float>(b[i + j]);
      }
    }
    float tail = 0.0f;
    for (; i < n; ++i) tail += a[i] * static_cast<float>(b[i]);
    return ((acc[0] + acc[2]) + (acc[1] + acc[3])) + tail;
  }
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      acc[j] += a[i + j] * static_cast<float>(b[i + j]);
    }
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * static_cast<float>(b[i]);
  // Pairwise tree with constant trip counts (unrolled, kept in registers).
  for (int j = 0; j < 8; ++j) acc[j] += acc[j + 8];
  for (int j = 0; j < 4; ++j) acc[j] += acc[j + 4];
  return ((acc[0] + acc[2]) + (acc[1] + acc[3])) + tail;
}

// o[i] += p * b[i].
template <typename T>
inline void Axpy(float p, const T* b, int64_t n, float* o) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] += p * static_cast<float>(b[i]);
}

// Softmax weights of one (token, head): grows to the longest context once per
// thread, then steady-state steps allocate nothing.
float* ScratchWeights(int64_t n) {
  thread_local std::vector<float> weights;
  if (weights.size() < static_cast<size_t>(n)) weights.resize(n);
  return weights.data();
}

enum class PagedKind { kPrefill, kDecode, kStatic };

// A step array in host memory (this backend's), as a span.
template <typename T>
absl::Span<const T> HostArray(const TensorView& t) {
  return absl::MakeConstSpan(t.data_as<const T>(),
                             static_cast<size_t>(t.numel()));
}

// The metadata's arrays read where they are (host memory on this backend).
struct HostMetadata {
  int32_t block_size = 0;
  int32_t num_seqs = 0;
  int64_t num_tokens = 0;
  int32_t max_blocks_per_seq = 0;
  absl::Span<const int32_t> query_start_loc, context_lens, seq_lens,
      block_tables;
  const int32_t* block_table(int32_t seq) const {
    return block_tables.data() + static_cast<int64_t>(seq) * max_blocks_per_seq;
  }
};

absl::Status ReadMetadata(absl::string_view op, const AttentionMetadata& m,
                          HostMetadata* out) {
  for (const auto& [name, view] : {std::pair<const char*, const TensorView*>{
                                       "query_start_loc", &m.query_start_loc},
                                   {"context_lens", &m.context_lens},
                                   {"seq_lens", &m.seq_lens},
                                   {"block_tables", &m.block_tables}}) {
    RETURN_IF_ERROR(CheckDType(op, name, *view, DType::kI32));
  }
  out->block_size = m.block_size;
  out->num_seqs = m.num_seqs;
  out->num_tokens = m.num_tokens;
  out->max_blocks_per_seq = m.max_blocks_per_seq;
  out->query_start_loc = HostArray<int32_t>(m.query_start_loc);
  out->context_lens = HostArray<int32_t>(m.context_lens);
  out->seq_lens = HostArray<int32_t>(m.seq_lens);
  out->block_tables = HostArray<int32_t>(m.block_tables);
  return absl::OkStatus();
}

// What a validated paged-attention call runs.
struct PagedPlan {
  CacheDims cache;
  int64_t num_heads = 0;
  int64_t group = 1;
  int64_t row_begin = 0;  // q rows of the chosen sequences.
  int64_t row_end = 0;
  int64_t max_keys = 0;  // Most keys one query attends.
  int64_t work = 0;      // Multiply-adds.
  HostMetadata meta;
};

absl::Status PlanPagedAttention(absl::string_view op, PagedKind kind,
                                const PagedAttentionArgs& args,
                                PagedPlan* plan) {
  if (args.metadata == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": no metadata"));
  }
  RETURN_IF_ERROR(ReadMetadata(op, *args.metadata, &plan->meta));
  const HostMetadata& m = plan->meta;
  const size_t num_seqs = m.num_seqs < 0 ? 0 : m.num_seqs;
  if (m.block_size <= 0 || m.num_seqs < 0 || m.max_blocks_per_seq < 0 ||
      m.query_start_loc.size() != num_seqs + 1 ||
      m.context_lens.size() != num_seqs || m.seq_lens.size() != num_seqs ||
      m.block_tables.size() < num_seqs * m.max_blocks_per_seq) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": malformed metadata (block_size ", m.block_size, ", ", m.num_seqs,
        " sequences, query_start_loc size ", m.query_start_loc.size(),
        ", block_tables size ", m.block_tables.size(), ")"));
  }
  if (args.first_seq < 0 || args.first_seq > args.end_seq ||
      args.end_seq > m.num_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": sequences [", args.first_seq, ", ", args.end_seq,
                     ") outside [0, ", m.num_seqs, "]"));
  }
  RETURN_IF_ERROR(CheckF32(op, "q", args.q));
  RETURN_IF_ERROR(CheckF32(op, "out", args.out));
  RETURN_IF_ERROR(CheckCache(op, args.cache, &plan->cache));
  const CacheDims& c = plan->cache;
  const Shape& qs = args.q.shape();
  const Shape& os = args.out.shape();
  if (qs.rank() != 3 || os.rank() != 3 || qs[0] != m.num_tokens ||
      os[0] != m.num_tokens || qs[1] != os[1] || qs[2] != c.dim ||
      os[2] != c.dim_v) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": q ", qs.ToString(), " and out ", os.ToString(),
                     " must be [num_tokens = ", m.num_tokens, ", heads, ",
                     c.dim, "] and [num_tokens, heads, ", c.dim_v, "]"));
  }
  if (qs[1] <= 0 || qs[1] % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", qs[1], " query heads are not a multiple of ",
                     c.num_kv_heads, " kv heads"));
  }
  if (args.sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": negative sliding window ", args.sliding_window));
  }
  plan->num_heads = qs[1];
  plan->group = qs[1] / c.num_kv_heads;
  plan->row_begin = m.query_start_loc[args.first_seq];
  plan->row_end = m.query_start_loc[args.end_seq];
  if (plan->row_begin < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": sequence #", args.first_seq, " starts at row ",
                     plan->row_begin));
  }
  plan->max_keys = 0;
  int64_t keys_total = 0;
  const int64_t window = args.sliding_window;
  const int64_t bs = m.block_size;
  int64_t prev_end = plan->row_begin;
  for (int32_t s = args.first_seq; s < args.end_seq; ++s) {
    const int64_t qb = m.query_start_loc[s];
    const int64_t qe = m.query_start_loc[s + 1];
    const int64_t ctx = m.context_lens[s];
    const int64_t seq_len = m.seq_lens[s];
    if (qb != prev_end || qe < qb || qe > m.num_tokens || ctx < 0 ||
        seq_len != ctx + (qe - qb)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": sequence #", s, " has rows [", qb, ", ", qe, ") of ",
          m.num_tokens, ", context ", ctx, " and length ", seq_len));
    }
    prev_end = qe;
    if (kind == PagedKind::kDecode && qe - qb != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": sequence #", s, " has query_len ", qe - qb,
                       "; the decode kernel needs 1"));
    }
    if (qe == qb) continue;
    const int32_t* table = m.block_table(s);
    if (kind == PagedKind::kStatic) {
      if (m.max_blocks_per_seq < 1 || seq_len > bs || table[0] < 0 ||
          table[0] * bs + seq_len > c.num_slots) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": sequence #", s, " of length ", seq_len,
                         " does not fit its static block ",
                         m.max_blocks_per_seq < 1 ? -1 : table[0], " of size ",
                         bs, " in ", c.num_slots, " slots"));
      }
    } else {
      // Only the blocks some query reads must be valid (a sliding window
      // leaves the older ones alone).
      const int64_t first_read =
          window > 0 ? std::max<int64_t>(0, ctx - window + 1) : 0;
      const int64_t num_blocks = (seq_len + bs - 1) / bs;
      if (num_blocks > m.max_blocks_per_seq) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": sequence #", s, " needs ", num_blocks,
                         " blocks, tables have ", m.max_blocks_per_seq));
      }
      for (int64_t b = first_read / bs; b < num_blocks; ++b) {
        const int64_t last_pos = std::min(seq_len - 1, b * bs + bs - 1);
        if (table[b] < 0 ||
            int64_t{table[b]} * bs + last_pos % bs >= c.num_slots) {
          return absl::InvalidArgumentError(absl::StrCat(
              op, ": sequence #", s, " block #", b, " is ", table[b],
              ", outside the cache of ", c.num_slots, " slots"));
        }
      }
    }
    for (int64_t p = ctx; p < seq_len; ++p) {
      keys_total += window > 0 ? std::min(p + 1, window) : p + 1;
    }
    plan->max_keys = std::max(plan->max_keys,
                              window > 0 ? std::min(seq_len, window) : seq_len);
  }
  plan->work = keys_total * plan->num_heads * (c.dim + c.dim_v);
  return absl::OkStatus();
}

// Asks for the cache lines of a row a few keys before it is read: rows are
// short and scattered over blocks, so the hardware prefetchers miss them.
inline void PrefetchRow(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i);
}
constexpr int64_t kPrefetchAhead = 8;

// Walks the slots of consecutive positions of one sequence without a
// division per position. Static layout: slot = table[0] * block_size + pos.
template <bool kStatic>
class SlotCursor {
 public:
  SlotCursor(const int32_t* table, int64_t block_size, int64_t pos)
      : table_(table), block_size_(block_size) {
    if (kStatic) {
      offset_ = int64_t{table[0]} * block_size + pos;
    } else {
      block_ = pos / block_size;
      offset_ = pos - block_ * block_size;
    }
  }
  int64_t slot() const {
    return kStatic ? offset_ : int64_t{table_[block_]} * block_size_ + offset_;
  }
  void Next() {
    ++offset_;
    if (!kStatic && offset_ == block_size_) {
      offset_ = 0;
      ++block_;
    }
  }

 private:
  const int32_t* table_;
  int64_t block_size_;
  int64_t block_ = 0;
  int64_t offset_ = 0;  // Static layout: the slot itself.
};

// Attention of one query row `row` (of sequence `seq`) and head `h`. The
// association of every sum is fixed by the key index alone, so the result is
// the same whatever batch, layout run or thread computes it.
template <typename T, bool kStatic>
void AttendOne(const PagedAttentionArgs& args, const PagedPlan& plan,
               int32_t seq, int64_t row, int64_t h, float* weights) {
  const HostMetadata& m = plan.meta;
  const CacheDims& c = plan.cache;
  const int64_t dim = c.dim;
  const int64_t dim_v = c.dim_v;
  const int64_t kv_heads = c.num_kv_heads;
  const int64_t pos = m.context_lens[seq] + (row - m.query_start_loc[seq]);
  const int64_t first =
      args.sliding_window > 0
          ? std::max<int64_t>(0, pos - args.sliding_window + 1)
          : 0;
  const int64_t num_keys = pos - first + 1;
  const int64_t kvh = h / plan.group;
  const float* qv =
      args.q.data_as<const float>() + (row * plan.num_heads + h) * dim;
  const T* k = args.cache.k.data_as<const T>() + kvh * dim;
  const T* v = args.cache.v.data_as<const T>() + kvh * dim_v;
  const int64_t k_stride = kv_heads * dim;
  const int64_t v_stride = kv_heads * dim_v;
  const int64_t k_bytes = dim * static_cast<int64_t>(sizeof(T));
  const int64_t v_bytes = dim_v * static_cast<int64_t>(sizeof(T));
  constexpr bool kQuantized = std::is_same_v<T, int8_t>;
  // Per-slot scales, stride kv_heads (int8 cache only).
  const float* k_scale =
      kQuantized ? args.cache.k_scale.data_as<const float>() + kvh : nullptr;
  const float* v_scale =
      kQuantized ? args.cache.v_scale.data_as<const float>() + kvh : nullptr;
  const int32_t* table = m.block_table(seq);
  const int64_t block_size = m.block_size;
  const float scale = args.scale;

  // Scores, then softmax with max subtraction.
  float max_score = -INFINITY;
  SlotCursor<kStatic> cursor(table, block_size, first);
  SlotCursor<kStatic> ahead(table, block_size, first);
  for (int64_t i = 0; i < std::min(kPrefetchAhead, num_keys);
       ++i, ahead.Next()) {
    PrefetchRow(k + ahead.slot() * k_stride, k_bytes);
  }
  for (int64_t i = 0; i < num_keys; ++i, cursor.Next()) {
    if (i + kPrefetchAhead < num_keys) {
      PrefetchRow(k + ahead.slot() * k_stride, k_bytes);
      ahead.Next();
    }
    const int64_t s = cursor.slot();
    float score = Dot(qv, k + s * k_stride, dim);
    if constexpr (kQuantized) {
      score *= k_scale[s * kv_heads] * scale;
    } else {
      score *= scale;
    }
    weights[i] = score;
    max_score = std::max(max_score, score);
  }
  float denom = 0.0f;
  for (int64_t i = 0; i < num_keys; ++i) {
    weights[i] = std::exp(weights[i] - max_score);
    denom += weights[i];
  }
  const float inv_denom = 1.0f / denom;
  auto prob = [&](int64_t i, int64_t s) {
    const float p = weights[i] * inv_denom;
    if constexpr (kQuantized) {
      return p * v_scale[s * kv_heads];
    } else {
      return p;
    }
  };

  // Weighted values, four keys per pass over the output row.
  float* o = args.out.data_as<float>() + (row * plan.num_heads + h) * dim_v;
  std::fill_n(o, dim_v, 0.0f);
  SlotCursor<kStatic> vcursor(table, block_size, first);
  SlotCursor<kStatic> vahead(table, block_size, first);
  int64_t prefetched = 0;
  for (; prefetched < std::min(kPrefetchAhead, num_keys);
       ++prefetched, vahead.Next()) {
    PrefetchRow(v + vahead.slot() * v_stride, v_bytes);
  }
  int64_t i = 0;
  for (; i + 4 <= num_keys; i += 4) {
    for (; prefetched < std::min(i + 4 + kPrefetchAhead, num_keys);
         ++prefetched, vahead.Next()) {
      PrefetchRow(v + vahead.slot() * v_stride, v_bytes);
    }
    int64_t s[4];
    for (int j = 0; j < 4; ++j, vcursor.Next()) s[j] = vcursor.slot();
    const float p0 = prob(i, s[0]), p1 = prob(i + 1, s[1]);
    const float p2 = prob(i + 2, s[2]), p3 = prob(i + 3, s[3]);
    const T* v0 = v + s[0] * v_stride;
    const T* v1 = v + s[1] * v_stride;
    const T* v2 = v + s[2] * v_stride;
    const T* v3 = v + s[3] * v_stride;
#pragma omp simd
    for (int64_t d = 0; d < dim_v; ++d) {
      o[d] +=
          (p0 * static_cast<float>(v0[d]) + p1 * static_cast<float>(v1[d])) +
          (p2 * static_cast<float>(v2[d]) + p3 * static_cast<float>(v3[d]));
    }
  }
  for (; i < num_keys; ++i, vcursor.Next()) {
    const int64_t s = vcursor.slot();
    Axpy(prob(i, s), v + s * v_stride, dim_v, o);
  }
}

// (row, head) pairs handed out in chunks: long causal rows and short ones mix
// in a batch, so static shares would leave threads idle.
constexpr int kAttentionChunk = 4;

// Runs every (row, head) of the plan. Each pair is computed by one thread in
// a fixed order, so its result does not depend on the batch or the threads.
template <typename T, bool kStatic>
void RunPagedAttention(const PagedAttentionArgs& args, const PagedPlan& plan,
                       bool one_row_per_seq, CpuThreadPool* pool) {
  const int32_t* starts = plan.meta.query_start_loc.data();
  const int64_t heads = plan.num_heads;
  const int64_t items = (plan.row_end - plan.row_begin) * heads;
  auto attend = [&](int64_t item, float* weights) {
    const int64_t row = plan.row_begin + item / heads;
    const int64_t h = item % heads;
    // The sequence owning `row`: the last one starting at or before it.
    const int32_t seq =
        one_row_per_seq
            ? static_cast<int32_t>(args.first_seq + (row - plan.row_begin))
            : static_cast<int32_t>(std::upper_bound(starts + args.first_seq + 1,
                                                    starts + args.end_seq + 1,
                                                    row) -
                                   (starts + 1));
    AttendOne<T, kStatic>(args, plan, seq, row, h, weights);
  };
  if (plan.work <= kParallelThreshold) {
    // Small work stays on the calling thread: even waking a spinning worker
    // costs more.
    float* weights = ScratchWeights(plan.max_keys);
    for (int64_t item = 0; item < items; ++item) attend(item, weights);
    return;
  }
  pool->ParallelFor(
      (items + kAttentionChunk - 1) / kAttentionChunk, [&](int64_t chunk) {
        float* weights = ScratchWeights(plan.max_keys);
        const int64_t end = std::min(items, (chunk + 1) * kAttentionChunk);
        for (int64_t item = chunk * kAttentionChunk; item < end; ++item) {
          attend(item, weights);
        }
      });
}

template <bool kStatic>
void DispatchPagedAttention(const PagedAttentionArgs& args,
                            const PagedPlan& plan, bool one_row_per_seq,
                            CpuThreadPool* pool) {
  if (plan.cache.quantized) {
    RunPagedAttention<int8_t, kStatic>(args, plan, one_row_per_seq, pool);
  } else {
    RunPagedAttention<float, kStatic>(args, plan, one_row_per_seq, pool);
  }
}

}  // namespace

CpuOps::CpuOps() : CpuOps(&CpuThreadPool::Default()) {}

absl::Status CpuOps::Embedding(const TensorView& table,
                               const TensorView& ids_view,
                               const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("Embedding", "table", table));
  RETURN_IF_ERROR(CheckF32("Embedding", "out", out));
  RETURN_IF_ERROR(CheckStepArray("Embedding", "ids", ids_view, DType::kI32));
  const absl::Span<const int32_t> ids = HostArray<int32_t>(ids_view);
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
                                    const TensorView& ids_view,
                                    int64_t first_id, const TensorView& out) {
  RETURN_IF_ERROR(CheckF32("EmbeddingShard", "table", table));
  RETURN_IF_ERROR(CheckF32("EmbeddingShard", "out", out));
  RETURN_IF_ERROR(
      CheckStepArray("EmbeddingShard", "ids", ids_view, DType::kI32));
  const absl::Span<const int32_t> ids = HostArray<int32_t>(ids_view);
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

absl::StatusOr<Tensor> CpuOps::Upload(const TensorView& host, DType dtype) {
  if (host.dtype() != DType::kF32 && host.dtype() != DType::kBF16 &&
      host.dtype() != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("Upload: host tensor is ", DTypeName(host.dtype()),
                     ", expected f32, bf16 or f16"));
  }
  if (dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CPU backend computes in f32, not ", DTypeName(dtype)));
  }
  ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, host.shape()));
  if (host.numel() == 0) return t;
  if (host.dtype() == DType::kF32) {
    std::memcpy(t.data(), host.data(), host.nbytes());
    return t;
  }
  // Widened straight into the tensor: no second host copy.
  RETURN_IF_ERROR(ConvertToF32(host.dtype(), host.data(),
                               static_cast<size_t>(host.numel()),
                               t.data_as<float>()));
  return t;
}

absl::Status CpuOps::ConcatShards(const TensorView& gathered, int64_t shards,
                                  const TensorView& out) {
  RETURN_IF_ERROR(CheckConcatShards(gathered, shards, out));
  const int64_t n = out.shape()[0], v = out.shape()[1];
  const int64_t vp = gathered.shape()[1];
  const float* g = gathered.data_as<const float>();
  float* o = out.data_as<float>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < shards && r * vp < v; ++r) {
      std::copy_n(g + (r * n + i) * vp, std::min(vp, v - r * vp),
                  o + i * v + r * vp);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuOps::GatherRows(const TensorView& src,
                                const TensorView& rows_view,
                                const TensorView& dst) {
  RETURN_IF_ERROR(CheckGatherRows(src, rows_view, dst));
  const absl::Span<const int32_t> rows = HostArray<int32_t>(rows_view);
  RETURN_IF_ERROR(GatherRowsInRange(rows, src.shape()[0]));
  const int64_t n = src.shape()[1];
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(src.data_as<const float>() + rows[i] * n, n,
                dst.data_as<float>() + static_cast<int64_t>(i) * n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<UploadBuffer>> CpuOps::NewUploadBuffer(
    size_t bytes) {
  return NewHostUploadBuffer(bytes);
}

absl::Status CpuOps::CopyToHost(const TensorView& src, void* dst) {
  if (src.numel() > 0) std::memcpy(dst, src.data(), src.nbytes());
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
  // Waking threads costs more than small products take (measured on the demo
  // model: 128-token prefill 10x slower with 2 threads), so they only run for
  // large ones.
  const bool large = t * n * k >= kBlasParallelThreshold;
  const BlasThreading& threading = GetBlasThreading();
  const float* xp = x.data_as<const float>();
  const float* wp = weight.data_as<const float>();
  float* o = out.data_as<float>();
  if (threading.openblas_threads) {
    openblas_set_num_threads(large ? threading.max_threads : 1);
    LinearSlice(xp, wp, t, k, n, 0, n, o);
  } else {
    // Slices of whole 64-row blocks (the last one also takes the rest), at
    // least min_blocks each, as even as they can be.
    const int64_t blocks = n / kBlasSliceAlign;
    const int64_t min_blocks = (kBlasSliceWork + t * k * kBlasSliceAlign - 1) /
                               (t * k * kBlasSliceAlign);
    const int64_t slices = large && pool_->threads() > 1
                               ? std::max<int64_t>(1, blocks / min_blocks)
                               : 1;
    pool_->ParallelFor(slices, [&](int64_t i) {
      const int64_t begin = i * blocks / slices * kBlasSliceAlign;
      const int64_t end =
          i + 1 == slices ? n : (i + 1) * blocks / slices * kBlasSliceAlign;
      LinearSlice(xp, wp, t, k, n, begin, end, o);
    });
  }
  if (bias != nullptr) {
    const float* b = bias->data_as<const float>();
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t c = 0; c < n; ++c) o[r * n + c] += b[c];
    }
  }
  return absl::OkStatus();
}

absl::Status CpuOps::Rope(const TensorView& x, const TensorView& positions_view,
                          const TensorView& inv_freq) {
  RETURN_IF_ERROR(CheckF32("Rope", "x", x));
  RETURN_IF_ERROR(CheckF32("Rope", "inv_freq", inv_freq));
  RETURN_IF_ERROR(
      CheckStepArray("Rope", "positions", positions_view, DType::kI32));
  const absl::Span<const int32_t> positions =
      HostArray<int32_t>(positions_view);
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

absl::Status CpuOps::StoreKvCache(const TensorView& k, const TensorView& v,
                                  const TensorView& slots_view,
                                  const KvCacheLayer& cache) {
  constexpr absl::string_view kOp = "StoreKvCache";
  RETURN_IF_ERROR(CheckF32(kOp, "k", k));
  RETURN_IF_ERROR(CheckF32(kOp, "v", v));
  RETURN_IF_ERROR(CheckStepArray(kOp, "slot_mapping", slots_view, DType::kI64));
  const absl::Span<const int64_t> slot_mapping = HostArray<int64_t>(slots_view);
  CacheDims c;
  RETURN_IF_ERROR(CheckCache(kOp, cache, &c));
  const int64_t tokens = static_cast<int64_t>(slot_mapping.size());
  if (k.shape() != Shape({tokens, c.num_kv_heads, c.dim}) ||
      v.shape() != Shape({tokens, c.num_kv_heads, c.dim_v})) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": k ", k.shape().ToString(), " and v ", v.shape().ToString(),
        " must be [", tokens, ", ", c.num_kv_heads, ", ", c.dim, "] and [",
        tokens, ", ", c.num_kv_heads, ", ", c.dim_v, "]"));
  }
  for (int64_t t = 0; t < tokens; ++t) {
    if (slot_mapping[t] < 0 || slot_mapping[t] >= c.num_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": slot ", slot_mapping[t], " of token ", t,
                       " is outside [0, ", c.num_slots, ")"));
    }
  }
  const int64_t k_row = c.num_kv_heads * c.dim;
  const int64_t v_row = c.num_kv_heads * c.dim_v;
  const float* kin = k.data_as<const float>();
  const float* vin = v.data_as<const float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (!c.quantized) {
      std::copy_n(kin + t * k_row, k_row,
                  cache.k.data_as<float>() + slot * k_row);
      std::copy_n(vin + t * v_row, v_row,
                  cache.v.data_as<float>() + slot * v_row);
      continue;
    }
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const int64_t scale_index = slot * c.num_kv_heads + h;
      QuantizeRow(kin + t * k_row + h * c.dim, c.dim,
                  cache.k.data_as<int8_t>() + slot * k_row + h * c.dim,
                  cache.k_scale.data_as<float>() + scale_index);
      QuantizeRow(vin + t * v_row + h * c.dim_v, c.dim_v,
                  cache.v.data_as<int8_t>() + slot * v_row + h * c.dim_v,
                  cache.v_scale.data_as<float>() + scale_index);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuOps::PrefillAttention(const PagedAttentionArgs& args) {
  PagedPlan plan;
  RETURN_IF_ERROR(
      PlanPagedAttention("PrefillAttention", PagedKind::kPrefill, args, &plan));
  DispatchPagedAttention</*kStatic=*/false>(args, plan,
                                            /*one_row_per_seq=*/false, pool_);
  return absl::OkStatus();
}

absl::Status CpuOps::DecodeAttention(const PagedAttentionArgs& args) {
  PagedPlan plan;
  RETURN_IF_ERROR(
      PlanPagedAttention("DecodeAttention", PagedKind::kDecode, args, &plan));
  DispatchPagedAttention</*kStatic=*/false>(args, plan,
                                            /*one_row_per_seq=*/true, pool_);
  return absl::OkStatus();
}

absl::Status CpuOps::StaticAttention(const PagedAttentionArgs& args) {
  PagedPlan plan;
  RETURN_IF_ERROR(
      PlanPagedAttention("StaticAttention", PagedKind::kStatic, args, &plan));
  DispatchPagedAttention</*kStatic=*/true>(args, plan,
                                           /*one_row_per_seq=*/false, pool_);
  return absl::OkStatus();
}

}  // namespace tessera
