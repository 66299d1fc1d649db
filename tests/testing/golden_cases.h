// The greedy tokens a golden case (tests/fixtures/golden/*/golden.json) must
// give, for every test that replays the fixtures.
//
// Phi-3 with LongRoPE: once a sequence grows past
// original_max_position_embeddings, transformers' Phi3ForCausalLM drops its
// cache so that the whole sequence is recomputed with the long factors
// (Tessera's scheduler does the same: ModelConfig::recompute_at_length).
// That is what transformers' own no-cache greedy loop computes, and the
// fixture records it as nocache_output_ids where it differs from
// generate()'s. transformers 5.17's generate() does not do it: the cache is
// dropped for one call only and generate() keeps passing the stale one, so
// from the crossing on every step runs the new token alone, without its
// context (reproduced token for token by running each step after the
// crossing as a one-token sequence at its position). A case that crosses is
// therefore held to the no-cache tokens.
#ifndef TESSERA_TESTS_TESTING_GOLDEN_CASES_H_
#define TESSERA_TESTS_TESTING_GOLDEN_CASES_H_

#include <cstdint>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/model/config.h"

namespace tessera {

inline const char* GoldenOutputKey(const ModelConfig& config,
                                   const nlohmann::json& golden_case) {
  return config.recompute_at_length > 0 &&
                 golden_case.contains("nocache_output_ids")
             ? "nocache_output_ids"
             : "output_ids";
}

inline std::vector<int32_t> GoldenOutputIds(const ModelConfig& config,
                                            const nlohmann::json& golden_case) {
  return golden_case[GoldenOutputKey(config, golden_case)]
      .get<std::vector<int32_t>>();
}

}  // namespace tessera

#endif  // TESSERA_TESTS_TESTING_GOLDEN_CASES_H_
