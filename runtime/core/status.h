// Status helpers shared by every layer.
//
// Debian's abseil (20220623) has no status_macros.h, so the two macros that
// every StatusOr-returning function needs live here, once.
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
// message>". OK statuses pass through unchanged.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_STATUS_H_
