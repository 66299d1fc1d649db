#include "parallel/mpi_world.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

bool IsPredefined(MPI_Comm comm) {
  return comm == MPI_COMM_WORLD || comm == MPI_COMM_SELF ||
         comm == MPI_COMM_NULL;
}

bool MpiFinalized() {
  int finalized = 0;
  // MPI_Finalized may be called at any time, even after MPI_Finalize.
  MPI_Finalized(&finalized);
  return finalized != 0;
}

absl::Status SetErrorsReturn(MPI_Comm comm, absl::string_view name) {
  const int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Comm_set_errhandler",
                    absl::StrCat("making MPI errors on ", name,
                                 " return codes instead of aborting"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS || length <= 0) {
    return absl::StrCat("unknown MPI error ", code);
  }
  return std::string(text, length);
}

absl::Status MpiError(int code, absl::string_view call,
                      absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", call,
                                          " failed: ", MpiErrorString(code),
                                          " (MPI error code ", code, ")"));
}

// ---- MpiComm ---------------------------------------------------------------

absl::StatusOr<MpiComm> MpiComm::Borrow(MPI_Comm comm, std::string name) {
  if (comm == MPI_COMM_NULL) {
    return absl::InvalidArgumentError(
        absl::StrCat("communicator ", name, " is MPI_COMM_NULL"));
  }
  int rank = -1, size = 0;
  int rc = MPI_Comm_rank(comm, &rank);
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Comm_rank",
                    absl::StrCat("reading rank in ", name));
  }
  rc = MPI_Comm_size(comm, &size);
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Comm_size",
                    absl::StrCat("reading size of ", name));
  }
  return MpiComm(comm, /*owned=*/false, rank, size, std::move(name));
}

absl::StatusOr<MpiComm> MpiComm::Adopt(MPI_Comm comm, std::string name) {
  if (comm == MPI_COMM_NULL) {
    return absl::InternalError(
        absl::StrCat("creating ", name, ": MPI returned MPI_COMM_NULL"));
  }
  // Own it first, so that any failure below still frees it.
  MpiComm owned(comm, /*owned=*/true, -1, 0, std::move(name));
  // The standard lets a new communicator inherit the parent's error handler,
  // but says so loosely across versions; setting it costs nothing and makes
  // sure no derived group can kill the job on an error we could report.
  RETURN_IF_ERROR(SetErrorsReturn(comm, owned.name_));
  int rc = MPI_Comm_rank(comm, &owned.rank_);
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Comm_rank",
                    absl::StrCat("reading rank in ", owned.name_));
  }
  rc = MPI_Comm_size(comm, &owned.size_);
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Comm_size",
                    absl::StrCat("reading size of ", owned.name_));
  }
  return owned;
}

absl::StatusOr<MpiComm> MpiComm::Split(const MpiComm& parent, int color,
                                       int key, std::string name) {
  if (color < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "splitting ", parent.Describe(), " into ", name, ": color ", color,
        " is negative (MPI_UNDEFINED is not supported)"));
  }
  MPI_Comm out = MPI_COMM_NULL;
  const int rc = MPI_Comm_split(parent.get(), color, key, &out);
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Comm_split",
                    absl::StrCat("splitting ", parent.Describe(), " into ",
                                 name, " (color ", color, ", key ", key, ")"));
  }
  return Adopt(out, std::move(name));
}

absl::StatusOr<MpiComm> MpiComm::Dup(const MpiComm& parent, std::string name) {
  MPI_Comm out = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(parent.get(), &out);
  if (rc != MPI_SUCCESS) {
    return MpiError(
        rc, "MPI_Comm_dup",
        absl::StrCat("duplicating ", parent.Describe(), " as ", name));
  }
  return Adopt(out, std::move(name));
}

absl::StatusOr<MpiComm> MpiComm::SplitShared(const MpiComm& parent,
                                             std::string name) {
  MPI_Comm out = MPI_COMM_NULL;
  const int rc = MPI_Comm_split_type(parent.get(), MPI_COMM_TYPE_SHARED,
                                     parent.rank(), MPI_INFO_NULL, &out);
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Comm_split_type",
                    absl::StrCat("finding the ranks of ", parent.Describe(),
                                 " that share this node"));
  }
  return Adopt(out, std::move(name));
}

MpiComm::MpiComm(MpiComm&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      owned_(std::exchange(other.owned_, false)),
      rank_(std::exchange(other.rank_, -1)),
      size_(std::exchange(other.size_, 0)),
      name_(std::move(other.name_)) {}

MpiComm& MpiComm::operator=(MpiComm&& other) noexcept {
  if (this != &other) {
    Release();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    owned_ = std::exchange(other.owned_, false);
    rank_ = std::exchange(other.rank_, -1);
    size_ = std::exchange(other.size_, 0);
    name_ = std::move(other.name_);
  }
  return *this;
}

MpiComm::~MpiComm() { Release(); }

void MpiComm::Release() {
  if (owned_ && !IsPredefined(comm_) && !MpiFinalized()) {
    // A destructor cannot return a Status; a failed free leaks one handle and
    // is worth one line, not an abort.
    const int rc = MPI_Comm_free(&comm_);
    if (rc != MPI_SUCCESS) {
      std::fprintf(stderr, "tessera: MPI_Comm_free of %s failed: %s\n",
                   name_.c_str(), MpiErrorString(rc).c_str());
    }
  }
  comm_ = MPI_COMM_NULL;
  owned_ = false;
}

std::string MpiComm::Describe() const {
  return absl::StrCat(name_, " of ", size_, size_ == 1 ? " rank" : " ranks");
}

// ---- MpiWorld --------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MpiWorld>> MpiWorld::Init(int* argc,
                                                         char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized || MpiFinalized()) {
    return absl::FailedPreconditionError(
        "MpiWorld::Init: MPI is already initialised (or finalised); create "
        "exactly one MpiWorld per process");
  }
  int provided = MPI_THREAD_SINGLE;
  // FUNNELED: worker threads exist (HTTP, tokenizer) but only the main
  // thread talks MPI; asking for MULTIPLE would slow every call for nothing.
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Init_thread", "starting MPI");
  }
  // From here on the world object exists, so every error path finalises.
  ASSIGN_OR_RETURN(MpiComm world, MpiComm::Borrow(MPI_COMM_WORLD, "world"));
  std::unique_ptr<MpiWorld> out(new MpiWorld(std::move(world)));
  if (provided < MPI_THREAD_FUNNELED) {
    return absl::FailedPreconditionError(
        absl::StrCat("MPI_Init_thread provided thread level ", provided,
                     ", below MPI_THREAD_FUNNELED (", MPI_THREAD_FUNNELED,
                     ") that Tessera needs"));
  }
  RETURN_IF_ERROR(SetErrorsReturn(MPI_COMM_WORLD, "MPI_COMM_WORLD"));
  // Errors that belong to no communicator are raised on MPI_COMM_WORLD
  // (MPI 3) or MPI_COMM_SELF (MPI 4): cover both.
  RETURN_IF_ERROR(SetErrorsReturn(MPI_COMM_SELF, "MPI_COMM_SELF"));

  // The node-local group tells the local rank without trusting launcher
  // variables (which differ between mpirun, srun and others).
  ASSIGN_OR_RETURN(MpiComm node_comm,
                   MpiComm::SplitShared(out->comm(), "node"));
  out->local_rank_ = node_comm.rank();
  out->local_size_ = node_comm.size();
  int leader = out->rank();
  rc = MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN,
                     node_comm.get());
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Allreduce", "finding each node's first rank");
  }
  out->node_leader_ = leader;
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  rc = MPI_Get_processor_name(name, &length);
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Get_processor_name", "naming this host");
  }
  out->host_name_.assign(name, length);
  return out;
}

MpiWorld::~MpiWorld() {
  if (MpiFinalized()) return;
  const int rc = MPI_Finalize();
  if (rc != MPI_SUCCESS) {
    std::fprintf(stderr, "tessera: rank %d: MPI_Finalize failed: %s\n", rank(),
                 MpiErrorString(rc).c_str());
  }
}

void MpiWorld::Abort(int code, absl::string_view message) const {
  // One write of the whole line, so that lines from several dying ranks do
  // not interleave mid-line.
  const std::string line =
      absl::StrCat("tessera: rank ", rank(), ": ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  // MPI_Abort is not required to return never; make sure this rank stops.
  std::_Exit(code == 0 ? 1 : code);
}

// ---- SplitGrid -------------------------------------------------------------

absl::StatusOr<GridComms> SplitGrid(const ProcessGrid& grid, int world_rank) {
  ASSIGN_OR_RETURN(MpiComm world, MpiComm::Borrow(MPI_COMM_WORLD, "world"));
  if (grid.world_size() != world.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job has ", world.size(), " ranks but tp × pp = ", grid.tp(), " × ",
        grid.pp(), " = ", grid.world_size(), "; they must be equal"));
  }
  if (world_rank != world.rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SplitGrid called with world_rank ", world_rank,
                     " on MPI rank ", world.rank()));
  }
  const GridPosition pos = grid.Position(world_rank);
  GridComms out;
  ASSIGN_OR_RETURN(
      out.tp, MpiComm::Split(world, pos.pp_stage, pos.tp_rank,
                             absl::StrCat("tp(stage ", pos.pp_stage, ")")));
  ASSIGN_OR_RETURN(
      out.pp, MpiComm::Split(world, pos.tp_rank, pos.pp_stage,
                             absl::StrCat("pp(tp_rank ", pos.tp_rank, ")")));
  // The whole design relies on group rank == grid coordinate; check it once
  // here rather than debug a wrong neighbour later.
  if (out.tp.rank() != pos.tp_rank || out.tp.size() != grid.tp() ||
      out.pp.rank() != pos.pp_stage || out.pp.size() != grid.pp()) {
    return absl::InternalError(absl::StrCat(
        "SplitGrid on rank ", world_rank, ": expected tp rank ", pos.tp_rank,
        " of ", grid.tp(), " and pp rank ", pos.pp_stage, " of ", grid.pp(),
        ", MPI gave tp ", out.tp.rank(), " of ", out.tp.size(), " and pp ",
        out.pp.rank(), " of ", out.pp.size()));
  }
  return out;
}

}  // namespace tessera
