// Status helpers shared by every layer.
//
// Debian's abseil (20220623) has no status_macros.h, so the two macros that
// every StatusOr-returning function needs live here, once.
//
// Error scope (one error channel per rank): in a job of many ranks an error
// is either the same on every rank (a bad flag, a config or grid every rank
// computed alike from the same input: rank 0 prints it once, every rank exits
// non-zero, nobody waits) or this rank's alone (no GPU here, a weight read
// that failed here, a step that failed once the plan was out: the other ranks
// are already waiting on this one, so the job must be aborted). Functions do
// not abort; they return a Status, and the code that knows an error is this
// rank's alone marks it RankLocal. The rank loop (parallel/) alone reads the
// mark and decides between "print once and exit" and MpiWorld::Abort. An
// unmarked error is the same on every rank. The mark is an absl::Status
// payload, so it survives RETURN_IF_ERROR, StatusOr and Annotate.
#ifndef TESSERA_RUNTIME_CORE_STATUS_H_
#define TESSERA_RUNTIME_CORE_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if
// not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    const ::absl::Status tessera_status_ = (expr);     \
    if (!tessera_status_.ok()) return tessera_status_; \
  } while (false)

#define TESSERA_CONCAT_INNER_(a, b) a##b
#define TESSERA_CONCAT_(a, b) TESSERA_CONCAT_INNER_(a, b)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares/assigns `x` from a StatusOr, or
// returns the error. `lhs` may be a declaration or an existing lvalue.
#define ASSIGN_OR_RETURN(lhs, expr)                                            \
  TESSERA_ASSIGN_OR_RETURN_IMPL_(TESSERA_CONCAT_(tessera_statusor_, __LINE__), \
                                 lhs, expr)

#define TESSERA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

namespace tessera {

// Prefixes an error with what was being done: "loading layer 3: <original
// message>". OK statuses pass through unchanged; payloads (the RankLocal mark)
// are kept.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// `status` marked as this rank's alone (see "Error scope" above). OK passes
// through unchanged.
absl::Status RankLocal(absl::Status status);

// Whether `status` carries the RankLocal mark (false for OK).
bool IsRankLocal(const absl::Status& status);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_STATUS_H_
