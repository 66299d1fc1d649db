// Run under mpirun: runs a parallel job (parallel/coordinator.h) for a golden
// fixture with the given --tp/--pp and, on rank 0, checks every golden case's
// prefill logits (gathered through the vocabulary-parallel head and returned
// in the StepResult) against transformers' within 1e-4 relative, and the
// greedy tokens exactly. Prints one PASS/FAIL line per case on rank 0; exits
// non-zero on any failure.
//   mpirun -np 4 mpi_logits_check FIXTURE_DIR TP PP
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "parallel/coordinator.h"
#include "parallel/mpi_world.h"
#include "runtime/engine/engine.h"
#include "runtime/model/config.h"
#include "tests/testing/golden_cases.h"

namespace {

// Rank 0: every golden case through the job. An error ends the job (RunJob);
// a mismatch is counted in *failures.
absl::Status Check(tessera::Coordinator& job, const std::string& dir,
                   const tessera::RankSpec& spec, int* failures) {
  std::ifstream in(dir + "/golden.json");
  const nlohmann::json golden =
      nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (golden.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/golden.json"));
  }
  tessera::EngineOptions engine_options;
  engine_options.scheduler.max_num_seqs = static_cast<int>(spec.max_num_seqs);
  engine_options.scheduler.max_num_batched_tokens = spec.max_num_batched_tokens;
  auto engine = tessera::Engine::Create(&job, engine_options, nullptr);
  if (!engine.ok()) return engine.status();
  // Every case at once: the scheduler batches them across the job.
  std::vector<int64_t> ids;
  std::vector<tessera::GenerationRequest> requests;
  for (const nlohmann::json& c : golden["cases"]) {
    tessera::GenerationRequest request;
    request.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    request.max_tokens = c["max_new_tokens"].get<int64_t>();
    request.sampling.temperature = 0.0f;
    request.return_prefill_logits = true;
    auto id = (*engine)->Submit(request);
    if (!id.ok()) return id.status();
    ids.push_back(*id);
    requests.push_back(request);
  }
  const absl::Status ran = (*engine)->RunUntilIdle();
  if (!ran.ok()) return ran;
  for (size_t i = 0; i < ids.size(); ++i) {
    const nlohmann::json& c = golden["cases"][i];
    const tessera::GenerationRequest& request = requests[i];
    auto result = (*engine)->TakeResult(ids[i]);
    if (!result.ok()) return result.status();
    double diff = 0, ref = 0;
    const std::vector<float>& got = result->prefill_logits;
    const bool sized = got.size() == c["prefill_logits"].size();
    for (size_t v = 0; sized && v < got.size(); ++v) {
      const double w = c["prefill_logits"][v].get<double>();
      diff += (got[v] - w) * (got[v] - w);
      ref += w * w;
    }
    const double rel = sized ? std::sqrt(diff / ref) : INFINITY;
    const bool tokens =
        result->output_ids == tessera::GoldenOutputIds(job.config(), c);
    const bool ok = rel < 1e-4 && tokens;
    *failures += !ok;
    std::printf(
        "%s: %s tp%d pp%d prompt of %zu: logits rel diff %.2e, tokens %s\n",
        ok ? "PASS" : "FAIL", golden["name"].get<std::string>().c_str(),
        spec.tp, spec.pp, request.prompt_ids.size(), rel,
        tokens ? "equal" : "DIFFER");
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: mpi_logits_check FIXTURE_DIR TP PP\n");
    return 2;
  }
  auto world = tessera::MpiWorld::Init(&argc, &argv);
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", std::string(world.status().message()).c_str());
    return 1;
  }
  const std::string dir = argv[1];
  tessera::RankSpec spec;
  spec.model_dir = dir;
  spec.tp = std::atoi(argv[2]);
  spec.pp = std::atoi(argv[3]);
  // A small pool and token budget: prefills are chunked and mixed with
  // decodes, and blocks are shared and recycled across the job.
  spec.max_num_seqs = 8;
  spec.max_num_batched_tokens = 32;
  spec.block_size = 4;
  spec.num_kv_blocks = 256;
  // Dynamic NTK and LongRoPE rotate a prefill chunk for the length at its
  // end, where transformers prefills a prompt whole (kernels/ops.h
  // RopeLengthScaling): their prompts run in one step.
  auto config = tessera::LoadModelConfig(dir);
  if (config.ok() &&
      (config->rope.scaling == tessera::RopeScaling::kDynamic ||
       config->rope.scaling == tessera::RopeScaling::kLongRope)) {
    spec.max_num_batched_tokens = 2048;
  }
  int failures = 0;
  const int code =
      tessera::RunJob(**world, spec, [&](tessera::Coordinator& job) {
        return Check(job, dir, spec, &failures);
      });
  return code != 0 ? code : (failures == 0 ? 0 : 1);
}
