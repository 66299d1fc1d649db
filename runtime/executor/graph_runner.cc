#include "runtime/executor/graph_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

std::vector<int32_t> DecodeGraphBuckets(int64_t max_batch) {
  std::vector<int32_t> buckets;
  if (max_batch < 1) return buckets;
  const int32_t cap =
      static_cast<int32_t>(std::min<int64_t>(max_batch, kMaxDecodeGraphBatch));
  for (int32_t b : {1, 2, 4}) {
    if (b <= cap) buckets.push_back(b);
  }
  for (int32_t b = 8; b <= cap; b += 8) buckets.push_back(b);
  if (buckets.back() != cap) buckets.push_back(cap);
  return buckets;
}

int32_t DecodeGraphBucket(absl::Span<const int32_t> buckets, int64_t batch) {
  if (batch < 1) return 0;
  auto it = std::lower_bound(buckets.begin(), buckets.end(), batch);
  return it == buckets.end() ? 0 : *it;
}

namespace {

// An open capture on the ops and the allocator; ends both when it is
// destroyed before Finish (an error or an exception in the captured code).
class CaptureScope {
 public:
  CaptureScope(Device* device, PinnableBlockAllocator* allocator)
      : device_(device), allocator_(allocator) {}
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
  ~CaptureScope() {
    if (device_open_) device_->EndCapture().status().IgnoreError();
    if (allocator_open_) allocator_->Cancel().IgnoreError();
  }

  absl::Status Begin() {
    if (allocator_ != nullptr) {
      RETURN_IF_ERROR(allocator_->BeginCapture());
      allocator_open_ = true;
    }
    RETURN_IF_ERROR(device_->BeginCapture());
    device_open_ = true;
    return absl::OkStatus();
  }
  // Blocks the graph reads that capture cannot see being allocated.
  absl::Status Reference(void* ptr) {
    if (allocator_open_ && ptr != nullptr) {
      return allocator_->Reference(ptr);
    }
    return absl::OkStatus();
  }
  // Ends the device capture (the graph), then pins what was recorded.
  absl::StatusOr<std::unique_ptr<DeviceGraph>> EndGraph() {
    device_open_ = false;
    return device_->EndCapture();
  }
  absl::StatusOr<PinLease> Commit() {
    if (!allocator_open_) return PinLease();
    allocator_open_ = false;
    return allocator_->Commit();
  }

 private:
  Device* device_;
  PinnableBlockAllocator* allocator_;
  bool device_open_ = false;
  bool allocator_open_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GraphRunner>> GraphRunner::Capture(
    Model* model, const KvPool& pool, AttentionBackend backend,
    StepInputs* inputs, absl::Span<const int32_t> buckets,
    const std::function<int64_t()>& free_device_bytes) {
  if (model == nullptr || inputs == nullptr || buckets.empty()) {
    return absl::InvalidArgumentError(
        "GraphRunner: a model, step inputs and at least one bucket");
  }
  if (backend != AttentionBackend::kPaged) {
    return absl::InvalidArgumentError(
        "GraphRunner: decode graphs need paged attention");
  }
  // Checked before anything runs: the warm-up's padded rows are for kernels
  // that honour graph-safe steps 2 (attention_metadata.h) (the CPU's attention
  // would read a -1 block).
  if (model->ops()->host_memory()) {
    return absl::UnimplementedError(
        "decode graphs need a backend that captures graphs (a GPU)");
  }
  const StepInputsLimits& l = inputs->limits();
  for (size_t i = 0; i < buckets.size(); ++i) {
    const int32_t b = buckets[i];
    if (b < 1 || b > l.max_seqs || b > l.max_tokens || b > l.max_logit_rows ||
        (i > 0 && b <= buckets[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("GraphRunner: bucket ", b,
                       " is not ascending within the step "
                       "limits (",
                       l.max_seqs, " sequences, ", l.max_tokens, " tokens, ",
                       l.max_logit_rows, " logit rows)"));
    }
  }
  std::unique_ptr<GraphRunner> runner(new GraphRunner());
  runner->model_ = model;
  runner->pool_ = &pool;
  runner->backend_ = backend;
  runner->inputs_ = inputs;
  runner->buckets_.assign(buckets.begin(), buckets.end());
  Ops* ops = model->ops();
  PinnableBlockAllocator* allocator = model->allocator();
  RETURN_IF_ERROR(ops->Synchronize());
  const int64_t free_before = free_device_bytes ? free_device_bytes() : 0;
  const int64_t reserved_before =
      allocator != nullptr ? allocator->stats().reserved_bytes : 0;
  for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
    RETURN_IF_ERROR(runner->CaptureOne(*it));
  }
  std::reverse(runner->graphs_.begin(), runner->graphs_.end());
  RETURN_IF_ERROR(ops->Synchronize());
  const int64_t reserved_after =
      allocator != nullptr ? allocator->stats().reserved_bytes : 0;
  int64_t bytes = reserved_after - reserved_before;
  if (free_device_bytes) {
    // The allocator's growth also left free memory: count it once.
    bytes = std::max<int64_t>(bytes, free_before - free_device_bytes());
  }
  runner->graph_bytes_ = std::max<int64_t>(bytes, 0);
  return runner;
}

absl::Status GraphRunner::CaptureOne(int32_t bucket) {
  Ops* ops = model_->ops();
  // A step of padding only: every row runs, no KV block is touched.
  RETURN_IF_ERROR(inputs_->Fill({}, static_cast<int32_t>(pool_->block_size()),
                                pool_->num_blocks(), {}, {}, bucket));
  StepBatch batch;
  batch.tokens = inputs_->tokens();
  batch.metadata = &inputs_->metadata();
  batch.backend = backend_;
  batch.logit_rows = inputs_->logit_rows();
  // The warm-up: whatever the ops make on first use exists before capture.
  RETURN_IF_ERROR(model_->ForwardBatch(batch, *pool_, /*logits=*/nullptr));
  RETURN_IF_ERROR(ops->Synchronize());
  Graph g;
  g.bucket = bucket;
  {
    CaptureScope scope(ops, model_->allocator());
    RETURN_IF_ERROR(scope.Begin());
    const absl::Status ran =
        model_->ForwardBatch(batch, *pool_, /*logits=*/nullptr);
    absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = scope.EndGraph();
    if (!ran.ok()) {
      return Annotate(ran, absl::StrCat("capturing the decode graph of ",
                                        bucket, " sequences"));
    }
    if (!graph.ok()) {
      return Annotate(graph.status(), absl::StrCat("capturing the decode "
                                                   "graph of ",
                                                   bucket, " sequences"));
    }
    g.graph = *std::move(graph);
    // The blocks the graph reads and writes that live outside the model.
    RETURN_IF_ERROR(scope.Reference(batch.tokens.data()));
    for (void* block : pool_->blocks()) {
      RETURN_IF_ERROR(scope.Reference(block));
    }
    ASSIGN_OR_RETURN(g.lease, scope.Commit());
  }
  g.logits = model_->step_logits();
  graphs_.push_back(std::move(g));
  return absl::OkStatus();
}

GraphRunner::~GraphRunner() {
  // Replays may still run on the stream: wait before destroying them.
  if (model_ != nullptr && !graphs_.empty()) {
    model_->ops()->Synchronize().IgnoreError();
  }
  graphs_.clear();  // Each graph before its lease (Graph's member order).
}

const GraphRunner::Graph* GraphRunner::Find(int32_t bucket) const {
  for (const Graph& g : graphs_) {
    if (g.bucket == bucket) return &g;
  }
  return nullptr;
}

absl::Status GraphRunner::Replay(int32_t bucket) {
  const Graph* g = Find(bucket);
  if (g == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("GraphRunner: no decode graph of ", bucket, " sequences"));
  }
  const AttentionMetadata& m = inputs_->metadata();
  const int32_t grid = inputs_->padded_grid_max_seq_len(
      static_cast<int32_t>(pool_->block_size()));
  if (m.num_seqs != bucket || m.num_tokens != bucket ||
      m.num_decode_seqs != bucket || m.grid_max_seq_len != grid ||
      m.block_size != pool_->block_size() ||
      inputs_->logit_rows().numel() != bucket) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GraphRunner: the step inputs hold ", m.num_seqs, " sequences of ",
        m.num_tokens, " tokens (grid ", m.grid_max_seq_len,
        "), not a decode step padded to ", bucket));
  }
  RETURN_IF_ERROR(g->graph->Launch());
  ++replays_;
  return absl::OkStatus();
}

TensorView GraphRunner::logits(int32_t bucket) const {
  const Graph* g = Find(bucket);
  return g != nullptr ? g->logits : TensorView();
}

}  // namespace tessera
