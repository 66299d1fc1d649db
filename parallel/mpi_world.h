// The MPI process environment: the job's world (MpiWorld), owned
// communicators (MpiComm), the TP/PP groups of a ProcessGrid (SplitGrid), and
// the one place where an MPI return code becomes an absl::Status (MpiError).
//
// Threading: MPI is initialised with MPI_THREAD_FUNNELED, so every MPI call
// of the job — control channel, MPI communicators, Abort — must come from the
// thread that called MpiWorld::Init (the main thread). Other threads (HTTP,
// tokenizer) hand their work to that thread instead of calling MPI.
//
// Lifetime: create the MpiWorld first in main() and destroy it last; every
// MpiComm (and everything built on one) must be destroyed before it, because
// MPI_Finalize runs in its destructor. An MpiComm that outlives MPI_Finalize
// skips MPI_Comm_free rather than crash, but that is a bug in the caller.
#ifndef TESSERA_PARALLEL_MPI_WORLD_H_
#define TESSERA_PARALLEL_MPI_WORLD_H_

#include <mpi.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "parallel/process_grid.h"

namespace tessera {

// "MPI_ERR_TRUNCATE: message truncated" for an MPI error code (the library's
// own text, from MPI_Error_string).
std::string MpiErrorString(int code);

// The Status for a failed MPI call: Internal,
// "<what>: <call> failed: <MPI_Error_string> (MPI error code N)".
// Callers build `what` only on the error path, so the hot path pays nothing:
//   if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Send", StrCat(...));
absl::Status MpiError(int code, absl::string_view call, absl::string_view what);

// An MPI communicator with a name for error messages. Move-only RAII: a
// communicator that this object created (Split, Dup) is released with
// MPI_Comm_free when the object dies; a borrowed one (Borrow, e.g.
// MPI_COMM_WORLD) never is. rank() and size() are cached at construction.
class MpiComm {
 public:
  // A non-owning wrapper. MPI_COMM_WORLD and MPI_COMM_SELF are only ever
  // borrowed.
  static absl::StatusOr<MpiComm> Borrow(MPI_Comm comm, std::string name);
  // MPI_Comm_split of `parent` (collective over parent). color >= 0; ranks
  // with the same color form one communicator, ordered by `key`.
  static absl::StatusOr<MpiComm> Split(const MpiComm& parent, int color,
                                       int key, std::string name);
  // MPI_Comm_dup of `parent` (collective): a separate matching space, so
  // traffic on the copy can never be received by a call on the parent.
  static absl::StatusOr<MpiComm> Dup(const MpiComm& parent, std::string name);
  // The ranks of `parent` that share this node (MPI_Comm_split_type with
  // MPI_COMM_TYPE_SHARED; collective), ordered by their rank in parent.
  static absl::StatusOr<MpiComm> SplitShared(const MpiComm& parent,
                                             std::string name);

  // No communicator (MPI_COMM_NULL), as a moved-from object is.
  MpiComm() = default;

  MpiComm(MpiComm&& other) noexcept;
  MpiComm& operator=(MpiComm&& other) noexcept;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  ~MpiComm();

  MPI_Comm get() const { return comm_; }
  bool is_null() const { return comm_ == MPI_COMM_NULL; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // "world", "tp(stage 1)", ...: used in every error that concerns the group.
  const std::string& name() const { return name_; }
  // "tp(stage 1) of 2 ranks": the group as error messages describe it.
  std::string Describe() const;

 private:
  MpiComm(MPI_Comm comm, bool owned, int rank, int size, std::string name)
      : comm_(comm),
        owned_(owned),
        rank_(rank),
        size_(size),
        name_(std::move(name)) {}
  // Wraps a communicator that MPI just created for us: sets
  // MPI_ERRORS_RETURN on it and caches rank/size; frees it on failure.
  static absl::StatusOr<MpiComm> Adopt(MPI_Comm comm, std::string name);
  void Release();

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = -1;
  int size_ = 0;
  std::string name_;
};

// The job: MPI_Init_thread(MPI_THREAD_FUNNELED) on creation, MPI_Finalize on
// destruction. Exactly one per process, created in main().
class MpiWorld {
 public:
  // Initialises MPI and sets MPI_ERRORS_RETURN on MPI_COMM_WORLD and
  // MPI_COMM_SELF (and on every MpiComm derived later), so MPI errors come back
  // as codes that become Statuses instead of killing the job without a word.
  // FailedPrecondition if MPI was already initialised or finalised, or the
  // library cannot provide MPI_THREAD_FUNNELED.
  static absl::StatusOr<std::unique_ptr<MpiWorld>> Init(int* argc,
                                                        char*** argv);

  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;
  ~MpiWorld();

  int rank() const { return world_.rank(); }
  int size() const { return world_.size(); }
  // This rank's index among the ranks of its node, and their number (from
  // MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), so it is right under mpirun,
  // srun and any other launcher; it agrees with OMPI_COMM_WORLD_LOCAL_RANK /
  // SLURM_LOCALID). A rank uses GPU local_rank() % device_count.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // The world rank of this node's local rank 0: equal for exactly the ranks
  // that share a node (as MPI sees nodes), so it identifies the node.
  int node_leader() const { return node_leader_; }
  // MPI_Get_processor_name: the host name, for logs. Two nodes may share a
  // name (containers, network namespaces); node_leader() tells them apart.
  const std::string& host_name() const { return host_name_; }
  // MPI_COMM_WORLD, borrowed.
  const MpiComm& comm() const { return world_; }

  // Prints "tessera: rank R: <message>" as one line on stderr and ends the
  // whole job with MPI_Abort(MPI_COMM_WORLD, code): every other rank is killed
  // too, wherever it is blocked, so a failure on one rank never leaves the
  // others waiting. Call from the MPI thread.
  [[noreturn]] void Abort(int code, absl::string_view message) const;

 private:
  explicit MpiWorld(MpiComm world) : world_(std::move(world)) {}

  MpiComm world_;
  int local_rank_ = 0;
  int local_size_ = 1;
  int node_leader_ = 0;
  std::string host_name_;
};

// The two groups a rank belongs to in a tp × pp grid.
struct GridComms {
  // Ranks of this rank's pipeline stage, ordered by tp_rank (so
  // tp.rank() == tp_rank). Named "tp(stage S)".
  MpiComm tp;
  // Ranks with this rank's tp_rank, ordered by pp_stage (so pp.rank() ==
  // pp_stage; the next stage is pp.rank() + 1). Named "pp(tp_rank T)".
  MpiComm pp;
};

// Splits MPI_COMM_WORLD into the TP and PP groups of `grid`. Collective over
// MPI_COMM_WORLD: every rank calls it with the same grid. InvalidArgument
// (before any communication, on every rank alike) when the grid does not
// match the world's size or world_rank is not this process's rank.
absl::StatusOr<GridComms> SplitGrid(const ProcessGrid& grid, int world_rank);

}  // namespace tessera

#endif  // TESSERA_PARALLEL_MPI_WORLD_H_
