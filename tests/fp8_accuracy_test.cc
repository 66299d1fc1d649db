// fp8 checkpoints against their references, teacher-forced (issue 20's
// accuracy report): for every fp8 golden fixture (tools/make_fp8_fixtures.py:
// one random-weight checkpoint per format, written with that format's own
// formulas), Tessera scores each position of transformers' greedy sequences
// and we count
//  - top-1 agreement with transformers running the same fp8 checkpoint
//    dequantized (the fixture's output_ids), and the relative error of the
//    next-token logits after each prompt (its prefill_logits);
//  - top-1 agreement with the unquantized model's greedy tokens
//    (unquantized_output_ids, teacher-forced along those), what fp8 costs.
// Every backend prints one line per fixture ("FP8ACCURACY ...") for
// docs/PERFORMANCE.md. The CPU (weights dequantized as they load) must
// reproduce transformers exactly; on a GPU (the gpu-tagged twin,
// TESSERA_TEST_DEVICE=cuda) f32 golden mode likewise, and bf16 mode — fp8
// products, activations rounded to fp8 where the tensor cores run — within
// bounds a wrong scale or a misread layout would break.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "nlohmann/json.hpp"
#include "runtime/executor/sequence_runner.h"
#include "runtime/model/registry.h"
#include "tests/test_paths.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

std::string TestDevice() {
  const char* d = std::getenv("TESSERA_TEST_DEVICE");
  return d != nullptr ? d : "cpu";
}

std::vector<std::string> Fp8Fixtures() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(GoldenDir())) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("fp8_", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

double RelativeError(const std::vector<float>& got, const Json& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i].get<double>();
    num += (got[i] - w) * (got[i] - w);
    den += w * w;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

int32_t ArgMax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

struct Accuracy {
  int64_t agree = 0, positions = 0;  // vs the fp8 reference.
  int64_t agree_unquantized = 0, unquantized_positions = 0;
  double max_logit_error = 0;  // Relative, after each prompt.
};

// Teacher-forced along `ids` after `prompt`: for each position j, whether
// Tessera's next token equals ids[j]; the logits after the prompt in
// `prefill`.
absl::Status Score(Model* model, const std::vector<int32_t>& prompt,
                   const std::vector<int32_t>& ids, int64_t* agree,
                   int64_t* positions, std::vector<float>* prefill) {
  SequenceRunner runner(model);
  const int64_t capacity = static_cast<int64_t>(prompt.size() + ids.size()) + 1;
  absl::StatusOr<KvCache> cache = runner.NewKvCache(capacity);
  if (!cache.ok()) return cache.status();
  std::vector<float> logits(model->config().vocab_size);
  absl::Status st = runner.Forward(prompt, &*cache, logits.data());
  if (!st.ok()) return st;
  if (prefill != nullptr) *prefill = logits;
  for (size_t j = 0; j < ids.size(); ++j) {
    *agree += ArgMax(logits) == ids[j] ? 1 : 0;
    ++*positions;
    if (j + 1 == ids.size()) break;
    st = runner.Forward({ids[j]}, &*cache, logits.data());
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

Accuracy Measure(const std::string& dir, Ops* ops,
                 const ModelPlacement& placement) {
  Accuracy a;
  auto model = LoadModel(dir, ops, 0, 1, placement);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return a;
  std::ifstream in(dir + "/golden.json");
  const Json golden = Json::parse(in);
  for (const Json& c : golden["cases"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    std::vector<float> prefill;
    absl::Status st =
        Score(model->get(), prompt, c["output_ids"].get<std::vector<int32_t>>(),
              &a.agree, &a.positions, &prefill);
    EXPECT_TRUE(st.ok()) << st;
    a.max_logit_error = std::max(a.max_logit_error,
                                 RelativeError(prefill, c["prefill_logits"]));
    if (c.contains("unquantized_output_ids")) {
      st = Score(model->get(), prompt,
                 c["unquantized_output_ids"].get<std::vector<int32_t>>(),
                 &a.agree_unquantized, &a.unquantized_positions, nullptr);
      EXPECT_TRUE(st.ok()) << st;
    }
  }
  return a;
}

void Report(const std::string& fixture, const std::string& backend,
            const Accuracy& a) {
  std::printf(
      "FP8ACCURACY %s %s: top-1 vs transformers (fp8, dequantized) %lld/%lld, "
      "max relative logit error %.3g; top-1 vs the unquantized model "
      "%lld/%lld\n",
      fixture.c_str(), backend.c_str(), static_cast<long long>(a.agree),
      static_cast<long long>(a.positions), a.max_logit_error,
      static_cast<long long>(a.agree_unquantized),
      static_cast<long long>(a.unquantized_positions));
}

class Fp8AccuracyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8AccuracyTest, TeacherForcedAgainstTransformers) {
  const std::string dir = GoldenDir() + "/" + GetParam();
  if (TestDevice() != "cuda") {
    CpuOps ops;
    const Accuracy a = Measure(dir, &ops, {});
    Report(GetParam(), "cpu f32", a);
    // Dequantized weights in f32: transformers' own computation.
    EXPECT_EQ(a.agree, a.positions);
    EXPECT_LT(a.max_logit_error, 1e-5);
    return;
  }
  if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no CUDA device";
  for (DType matrices : {DType::kF32, DType::kBF16}) {
    auto backend = CreateBackend("cuda", 0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    ModelPlacement placement;
    placement.allocator = backend->allocator.get();
    placement.matrix_dtype = matrices;
    const Accuracy a = Measure(dir, backend->ops.get(), placement);
    const bool fp8 = matrices == DType::kBF16;
    Report(GetParam(), fp8 ? "cuda fp8 products" : "cuda f32", a);
    if (!fp8) {
      EXPECT_EQ(a.agree, a.positions);
      EXPECT_LT(a.max_logit_error, 1e-4);
      continue;
    }
    // fp8-rounded activations (2^-4 relative per element) through two
    // layers of a random model move logits by a few percent; a wrong scale
    // or layout moves them by their whole size.
    EXPECT_LT(a.max_logit_error, 0.15);
    EXPECT_GE(a.agree * 2, a.positions);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8AccuracyTest,
                         ::testing::ValuesIn(Fp8Fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tessera
