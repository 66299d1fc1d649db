// A StepExecutor that forwards everything to another one, for tests that
// inject faults into a real model's steps: derive and override Execute.
#ifndef TESSERA_TESTS_TESTING_DELEGATING_EXECUTOR_H_
#define TESSERA_TESTS_TESTING_DELEGATING_EXECUTOR_H_

#include <string>
#include <vector>

#include "runtime/engine/engine.h"

namespace tessera {

class DelegatingExecutor : public StepExecutor {
 public:
  // `inner` must outlive this executor.
  explicit DelegatingExecutor(StepExecutor* inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_->config(); }
  AllocatorStats memory_stats() const override {
    return inner_->memory_stats();
  }
  MemoryBreakdown memory_breakdown() const override {
    return inner_->memory_breakdown();
  }
  KvLayout kv_layout() const override { return inner_->kv_layout(); }
  std::vector<int32_t> decode_graph_buckets() const override {
    return inner_->decode_graph_buckets();
  }
  int64_t max_step_tokens() const override { return inner_->max_step_tokens(); }
  int64_t max_step_seqs() const override { return inner_->max_step_seqs(); }
  int32_t max_top_logprobs() const override {
    return inner_->max_top_logprobs();
  }
  absl::Status Execute(const proto::StepPlan& plan,
                       proto::StepResult* result) override {
    return inner_->Execute(plan, result);
  }
  absl::Status SetTrace(TraceRing* ring) override {
    return inner_->SetTrace(ring);
  }
  absl::Status SetOpProfiling(bool on) override {
    return inner_->SetOpProfiling(on);
  }
  absl::StatusOr<std::vector<OpTimeTotal>> TakeOpProfile() override {
    return inner_->TakeOpProfile();
  }
  std::string op_profile_scope() const override {
    return inner_->op_profile_scope();
  }

 protected:
  StepExecutor* inner() const { return inner_; }

 private:
  StepExecutor* inner_;
};

}  // namespace tessera

#endif  // TESSERA_TESTS_TESTING_DELEGATING_EXECUTOR_H_
