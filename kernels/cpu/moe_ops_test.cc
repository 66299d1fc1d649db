// The CPU mixture-of-experts ops (MoeRoute, MoeExperts, SigmoidGatedAdd)
// against direct float64 transcriptions of transformers' routers and expert
// loops, on fresh random inputs.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"

namespace tessera {
namespace {

class MoeOpsTest : public ::testing::Test {
 protected:
  Tensor Random(Shape shape, float scale = 1.0f) {
    Tensor t = *Tensor::Empty(DType::kF32, std::move(shape));
    std::normal_distribution<float> dist(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng_);
    return t;
  }
  Tensor Empty(DType dtype, Shape shape) {
    return *Tensor::Empty(dtype, std::move(shape));
  }
  // Routing that picks k distinct experts of `experts` per token, with
  // positive weights.
  void RandomRouting(int64_t tokens, int64_t k, int64_t experts, Tensor* ids,
                     Tensor* weights) {
    *ids = Empty(DType::kI32, {tokens, k});
    *weights = Empty(DType::kF32, {tokens, k});
    std::vector<int32_t> all(experts);
    std::iota(all.begin(), all.end(), 0);
    std::uniform_real_distribution<float> w(0.05f, 1.0f);
    for (int64_t t = 0; t < tokens; ++t) {
      std::shuffle(all.begin(), all.end(), rng_);
      for (int64_t j = 0; j < k; ++j) {
        ids->data_as<int32_t>()[t * k + j] = all[j];
        weights->data_as<float>()[t * k + j] = w(rng_);
      }
    }
  }

  std::mt19937 rng_{std::random_device{}()};
  CpuOps ops_;
};

// The reference router: softmax in float64, experts sorted by (probability
// descending, id ascending), the first k, renormalised when asked.
void ReferenceRoute(const float* logits, int64_t experts, int64_t k,
                    bool renormalize, std::vector<int32_t>* ids,
                    std::vector<double>* weights) {
  double max = -INFINITY;
  for (int64_t e = 0; e < experts; ++e) max = std::max<double>(max, logits[e]);
  std::vector<double> p(experts);
  double sum = 0;
  for (int64_t e = 0; e < experts; ++e) sum += p[e] = std::exp(logits[e] - max);
  for (double& v : p) v /= sum;
  std::vector<int32_t> order(experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  ids->assign(order.begin(), order.begin() + k);
  weights->clear();
  double total = 0;
  for (int32_t id : *ids) total += p[id];
  for (int32_t id : *ids)
    weights->push_back(renormalize ? p[id] / total : p[id]);
}

TEST_F(MoeOpsTest, RouteMatchesSoftmaxTopK) {
  for (const auto& [tokens, experts, k] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 8, 2},
        {7, 8, 2},
        {5, 60, 4},
        {9, 128, 8},
        {3, 16, 16},
        {2, 1, 1}}) {
    for (bool renormalize : {false, true}) {
      Tensor logits = Random({tokens, experts}, 2.0f);
      Tensor ids = Empty(DType::kI32, {tokens, k});
      Tensor weights = Empty(DType::kF32, {tokens, k});
      ASSERT_TRUE(
          ops_.MoeRoute(logits.view(), renormalize, ids.view(), weights.view())
              .ok());
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<int32_t> want_ids;
        std::vector<double> want_w;
        ReferenceRoute(logits.data_as<float>() + t * experts, experts, k,
                       renormalize, &want_ids, &want_w);
        for (int64_t j = 0; j < k; ++j) {
          EXPECT_EQ(ids.data_as<int32_t>()[t * k + j], want_ids[j])
              << "E " << experts << " token " << t << " pick " << j;
          EXPECT_NEAR(weights.data_as<float>()[t * k + j], want_w[j],
                      1e-6 * (1 + want_w[j]));
        }
      }
    }
  }
}

// Equal probabilities go to the lower id first (torch.topk's usual order);
// a NaN row ranks every expert alike.
TEST_F(MoeOpsTest, RouteBreaksTiesByTheLowerId) {
  const float rows[3][6] = {
      {0, 1, 1, 0, 1, -1}, {2, 2, 2, 2, 2, 2}, {0, NAN, 1, 0, 0, 0}};
  Tensor logits = Empty(DType::kF32, {3, 6});
  std::copy_n(&rows[0][0], 18, logits.data_as<float>());
  Tensor ids = Empty(DType::kI32, {3, 3});
  Tensor weights = Empty(DType::kF32, {3, 3});
  ASSERT_TRUE(
      ops_.MoeRoute(logits.view(), true, ids.view(), weights.view()).ok());
  const int32_t want[3][3] = {{1, 2, 4}, {0, 1, 2}, {0, 1, 2}};
  for (int t = 0; t < 3; ++t) {
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(ids.data_as<int32_t>()[t * 3 + j], want[t][j]) << t << j;
    }
  }
  for (int j = 0; j < 3; ++j) {
    EXPECT_FLOAT_EQ(weights.data_as<float>()[3 + j], 1.0f / 3);
  }
}

TEST_F(MoeOpsTest, RouteRefusesBadShapes) {
  Tensor logits = Random({4, 8});
  Tensor ids = Empty(DType::kI32, {4, 9});
  Tensor weights = Empty(DType::kF32, {4, 9});
  EXPECT_EQ(
      ops_.MoeRoute(logits.view(), true, ids.view(), weights.view()).code(),
      absl::StatusCode::kInvalidArgument);  // k > E.
  Tensor ids2 = Empty(DType::kF32, {4, 2});
  Tensor weights2 = Empty(DType::kF32, {4, 2});
  EXPECT_EQ(
      ops_.MoeRoute(logits.view(), true, ids2.view(), weights2.view()).code(),
      absl::StatusCode::kInvalidArgument);  // ids not int32.
  Tensor ids3 = Empty(DType::kI32, {3, 2});
  EXPECT_EQ(
      ops_.MoeRoute(logits.view(), true, ids3.view(), weights2.view()).code(),
      absl::StatusCode::kInvalidArgument);
}

double Silu(double v) { return v / (1.0 + std::exp(-v)); }

// out[t] = sum_j w[t, j] * down_e(silu(gate_e x) * up_e x), e = ids - first,
// in float64 over the experts [first, first + E).
std::vector<double> ReferenceExperts(const Tensor& x, const Tensor& ids,
                                     const Tensor& weights,
                                     const Tensor& gate_up, const Tensor& down,
                                     int64_t first) {
  const int64_t tokens = x.shape()[0], hidden = x.shape()[1];
  const int64_t k = ids.shape()[1];
  const int64_t experts = gate_up.shape()[0], inter = gate_up.shape()[1] / 2;
  std::vector<double> out(tokens * hidden, 0.0);
  std::vector<double> act(inter);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xr = x.data_as<float>() + t * hidden;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids.data_as<int32_t>()[t * k + j] - first;
      if (e < 0 || e >= experts) continue;
      const float* gu = gate_up.data_as<float>() + e * 2 * inter * hidden;
      const float* dn = down.data_as<float>() + e * hidden * inter;
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < hidden; ++h) {
          g += double{gu[i * hidden + h]} * xr[h];
          u += double{gu[(inter + i) * hidden + h]} * xr[h];
        }
        act[i] = Silu(g) * u;
      }
      const double w = weights.data_as<float>()[t * k + j];
      for (int64_t h = 0; h < hidden; ++h) {
        double y = 0;
        for (int64_t i = 0; i < inter; ++i)
          y += double{dn[h * inter + i]} * act[i];
        out[t * hidden + h] += w * y;
      }
    }
  }
  return out;
}

TEST_F(MoeOpsTest, ExpertsMatchThePerTokenSum) {
  for (const auto& [tokens, experts, k, hidden, inter, first] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>{
            1, 8, 2, 64, 48, 0},
        {13, 8, 2, 64, 128, 0},
        {40, 16, 4, 32, 24, 0},
        {6, 4, 1, 16, 8, 0},
        // Expert parallelism: experts 4..7 of 8 here, the rest elsewhere.
        {21, 4, 2, 32, 16, 4}}) {
    Tensor x = Random({tokens, hidden});
    Tensor gate_up = Random({experts, 2 * inter, hidden}, 0.2f);
    Tensor down = Random({experts, hidden, inter}, 0.2f);
    Tensor ids, weights;
    RandomRouting(tokens, k, experts + first, &ids, &weights);
    const int64_t bytes =
        ops_.MoeExpertsScratchBytes(tokens, k, experts, hidden, inter);
    Tensor scratch = Empty(DType::kF32, {(bytes + 3) / 4});
    Tensor out = Random({tokens, hidden});  // Overwritten.
    MoeExpertsArgs args;
    args.x = x.view();
    args.topk_ids = ids.view();
    args.topk_weights = weights.view();
    args.gate_up = gate_up;
    args.down = down;
    args.first_expert = first;
    args.scratch = scratch.view();
    args.out = out.view();
    ASSERT_TRUE(ops_.MoeExperts(args).ok());
    const std::vector<double> want =
        ReferenceExperts(x, ids, weights, gate_up, down, first);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(out.data_as<float>()[i], want[i],
                  1e-4 * (1 + std::fabs(want[i])))
          << "T " << tokens << " E " << experts << " element " << i;
    }
  }
}

// A token none of whose experts is here gets zeros; ids anywhere (negative,
// beyond every expert) are someone else's.
TEST_F(MoeOpsTest, ExpertsSkipOtherRanksExperts) {
  const int64_t tokens = 3, k = 2, experts = 2, hidden = 8, inter = 4;
  Tensor x = Random({tokens, hidden});
  Tensor gate_up = Random({experts, 2 * inter, hidden});
  Tensor down = Random({experts, hidden, inter});
  Tensor ids = Empty(DType::kI32, {tokens, k});
  const int32_t values[] = {-1, 7, 2, 3, 9, 2};  // Experts 2, 3 here.
  std::copy_n(values, 6, ids.data_as<int32_t>());
  Tensor weights = Random({tokens, k});
  Tensor scratch = Empty(
      DType::kF32,
      {ops_.MoeExpertsScratchBytes(tokens, k, experts, hidden, inter) / 4 + 1});
  Tensor out = Random({tokens, hidden});
  MoeExpertsArgs args{x.view(), ids.view(), weights.view(), gate_up,
                      down,     2,          scratch.view(), out.view()};
  ASSERT_TRUE(ops_.MoeExperts(args).ok());
  for (int64_t h = 0; h < hidden; ++h) EXPECT_EQ(out.data_as<float>()[h], 0.0f);
  const std::vector<double> want =
      ReferenceExperts(x, ids, weights, gate_up, down, 2);
  for (int64_t i = hidden; i < tokens * hidden; ++i) {
    EXPECT_NEAR(out.data_as<float>()[i], want[i],
                1e-4 * (1 + std::fabs(want[i])));
  }
}

// Two experts' terms add in ascending expert id, whatever the pick order,
// each product rounded first: the same bits as the loop transformers runs.
TEST_F(MoeOpsTest, ExpertsAddInAscendingExpertOrder) {
  const int64_t tokens = 2, k = 3, experts = 3, hidden = 16, inter = 8;
  Tensor x = Random({tokens, hidden});
  Tensor gate_up = Random({experts, 2 * inter, hidden});
  Tensor down = Random({experts, hidden, inter});
  Tensor ids = Empty(DType::kI32, {tokens, k});
  const int32_t picks[] = {2, 0, 1, 1, 2, 0};
  std::copy_n(picks, 6, ids.data_as<int32_t>());
  Tensor weights = Random({tokens, k});
  Tensor scratch = Empty(
      DType::kF32,
      {ops_.MoeExpertsScratchBytes(tokens, k, experts, hidden, inter) / 4 + 1});
  Tensor out = Empty(DType::kF32, {tokens, hidden});
  MoeExpertsArgs args{x.view(), ids.view(), weights.view(), gate_up,
                      down,     0,          scratch.view(), out.view()};
  ASSERT_TRUE(ops_.MoeExperts(args).ok());
  // Each expert alone, through the same op (one pick per token).
  std::vector<Tensor> alone;
  for (int32_t e = 0; e < experts; ++e) {
    Tensor one_id = Empty(DType::kI32, {tokens, 1});
    Tensor one_w = Empty(DType::kF32, {tokens, 1});
    for (int64_t t = 0; t < tokens; ++t) {
      one_id.data_as<int32_t>()[t] = e;
      one_w.data_as<float>()[t] = 1.0f;
    }
    Tensor y = Empty(DType::kF32, {tokens, hidden});
    MoeExpertsArgs single{x.view(), one_id.view(),  one_w.view(), gate_up, down,
                          0,        scratch.view(), y.view()};
    ASSERT_TRUE(ops_.MoeExperts(single).ok());
    alone.push_back(std::move(y));
  }
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < hidden; ++h) {
      float want = 0.0f;
      for (int32_t e = 0; e < experts; ++e) {
        int64_t j = 0;
        while (picks[t * k + j] != e) ++j;
        const float term = weights.data_as<float>()[t * k + j] *
                           alone[e].data_as<float>()[t * hidden + h];
        want = want + term;
      }
      EXPECT_EQ(out.data_as<float>()[t * hidden + h], want) << t << " " << h;
    }
  }
}

TEST_F(MoeOpsTest, ExpertsRefuseBadArguments) {
  const int64_t tokens = 4, k = 2, experts = 4, hidden = 8, inter = 4;
  Tensor x = Random({tokens, hidden});
  Tensor gate_up = Random({experts, 2 * inter, hidden});
  Tensor down = Random({experts, hidden, inter});
  Tensor ids, weights;
  RandomRouting(tokens, k, experts, &ids, &weights);
  const int64_t bytes =
      ops_.MoeExpertsScratchBytes(tokens, k, experts, hidden, inter);
  Tensor scratch = Empty(DType::kF32, {bytes / 4});
  Tensor small = Empty(DType::kF32, {bytes / 4 - 1});
  Tensor out = Empty(DType::kF32, {tokens, hidden});
  MoeExpertsArgs good{x.view(), ids.view(), weights.view(), gate_up,
                      down,     0,          scratch.view(), out.view()};
  ASSERT_TRUE(ops_.MoeExperts(good).ok());
  MoeExpertsArgs a = good;
  a.scratch = small.view();
  absl::Status s = ops_.MoeExperts(a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("scratch"), absl::string_view::npos) << s;
  Tensor bad_down = Random({experts, hidden, inter + 1});
  a = good;
  a.down = bad_down;
  EXPECT_EQ(ops_.MoeExperts(a).code(), absl::StatusCode::kInvalidArgument);
  a = good;
  a.out = x.view();  // Aliases x.
  EXPECT_EQ(ops_.MoeExperts(a).code(), absl::StatusCode::kInvalidArgument);
  a = good;
  a.first_expert = -1;
  EXPECT_EQ(ops_.MoeExperts(a).code(), absl::StatusCode::kInvalidArgument);
  Tensor flat = Random({experts * 2 * inter, hidden});
  a = good;
  a.gate_up = flat;
  EXPECT_EQ(ops_.MoeExperts(a).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MoeOpsTest, SigmoidGatedAdd) {
  const int64_t tokens = 5, n = 12;
  Tensor gate = Random({tokens, 1}, 3.0f);
  Tensor x = Random({tokens, n});
  Tensor out = Random({tokens, n});
  std::vector<double> want(tokens * n);
  for (int64_t t = 0; t < tokens; ++t) {
    const double s = 1.0 / (1.0 + std::exp(-double{gate.data_as<float>()[t]}));
    for (int64_t i = 0; i < n; ++i) {
      want[t * n + i] =
          out.data_as<float>()[t * n + i] + s * x.data_as<float>()[t * n + i];
    }
  }
  ASSERT_TRUE(ops_.SigmoidGatedAdd(gate.view(), x.view(), out.view()).ok());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(out.data_as<float>()[i], want[i],
                1e-6 * (1 + std::fabs(want[i])));
  }
  Tensor wide = Random({tokens, 2});
  EXPECT_EQ(ops_.SigmoidGatedAdd(wide.view(), x.view(), out.view()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops_.SigmoidGatedAdd(gate.view(), x.view(), x.view()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
