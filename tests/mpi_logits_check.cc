// Run under mpirun: builds a ParallelJob for a golden fixture with the given
// --tp/--pp and, on rank 0, checks every golden case's prefill logits (gathered
// through the vocabulary-parallel head and returned in the StepResult) against
// transformers' within 1e-4 relative, and the greedy tokens exactly. Prints one
// PASS/FAIL line per case on rank 0; exits non-zero on any failure.
//   mpirun -np 4 mpi_logits_check FIXTURE_DIR TP PP
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/mpi_world.h"
#include "parallel/parallel_job.h"
#include "runtime/engine/engine.h"

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
  tessera::ParallelOptions options;
  options.tp = std::atoi(argv[2]);
  options.pp = std::atoi(argv[3]);
  // A small pool and token budget: prefills are chunked and mixed with
  // decodes, and blocks are shared and recycled across the job.
  options.max_num_seqs = 8;
  options.max_num_batched_tokens = 32;
  options.kv.block_size = 4;
  options.kv.num_blocks = 256;
  auto job = tessera::ParallelJob::Create(**world, dir, options);
  if (!job.ok()) (*world)->Abort(1, job.status().message());
  if (!(*job)->is_coordinator()) {
    const absl::Status served = (*job)->ServeSteps();
    if (!served.ok()) (*world)->Abort(1, served.message());
    return 0;
  }
  std::ifstream in(dir + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  tessera::EngineOptions engine_options;
  engine_options.scheduler.max_num_seqs = options.max_num_seqs;
  engine_options.scheduler.max_num_batched_tokens =
      options.max_num_batched_tokens;
  auto engine = tessera::Engine::Create(job->get(), engine_options, nullptr);
  if (!engine.ok()) (*world)->Abort(1, engine.status().message());
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
    if (!id.ok()) (*world)->Abort(1, id.status().message());
    ids.push_back(*id);
    requests.push_back(request);
  }
  const absl::Status ran = (*engine)->RunUntilIdle();
  if (!ran.ok()) (*world)->Abort(1, ran.message());
  int failures = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const nlohmann::json& c = golden["cases"][i];
    const tessera::GenerationRequest& request = requests[i];
    auto result = (*engine)->TakeResult(ids[i]);
    if (!result.ok()) (*world)->Abort(1, result.status().message());
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
        result->output_ids == c["output_ids"].get<std::vector<int32_t>>();
    const bool ok = rel < 1e-4 && tokens;
    failures += !ok;
    std::printf(
        "%s: %s tp%d pp%d prompt of %zu: logits rel diff %.2e, tokens %s\n",
        ok ? "PASS" : "FAIL", golden["name"].get<std::string>().c_str(),
        options.tp, options.pp, request.prompt_ids.size(), rel,
        tokens ? "equal" : "DIFFER");
  }
  std::fflush(stdout);
  const absl::Status shutdown = (*job)->Shutdown();
  if (!shutdown.ok()) (*world)->Abort(1, shutdown.message());
  return failures == 0 ? 0 : 1;
}
