// ProcessGrid: how the world of ranks is laid out as tensor-parallel (TP)
// groups inside pipeline-parallel (PP) stages.
//
// world = tp × pp; rank r has pp_stage = r / tp and tp_rank = r % tp, so a TP
// group is a run of consecutive ranks (one node under the usual placement) and
// PP crosses nodes — the FasterTransformer / TensorRT-LLM recipe. This is the
// pure arithmetic; the MPI communicators built on it live beside it.
#ifndef TESSERA_PARALLEL_PROCESS_GRID_H_
#define TESSERA_PARALLEL_PROCESS_GRID_H_

#include "absl/status/statusor.h"

namespace tessera {

struct GridPosition {
  int rank = 0;
  int tp_rank = 0;   // Position inside the TP group.
  int pp_stage = 0;  // Which pipeline stage.
};

class ProcessGrid {
 public:
  // InvalidArgument when tp or pp < 1, or world_size != tp × pp (the message
  // names all three).
  static absl::StatusOr<ProcessGrid> Create(int world_size, int tp, int pp);

  int world_size() const { return tp_ * pp_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }

  GridPosition Position(int rank) const {
    return {rank, rank % tp_, rank / tp_};
  }
  int RankOf(int pp_stage, int tp_rank) const {
    return pp_stage * tp_ + tp_rank;
  }

  // The rank that owns the request loop and the scheduler.
  static constexpr int kCoordinatorRank = 0;

 private:
  ProcessGrid(int tp, int pp) : tp_(tp), pp_(pp) {}
  int tp_;
  int pp_;
};

}  // namespace tessera

#endif  // TESSERA_PARALLEL_PROCESS_GRID_H_
