#include "runtime/core/status.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace tessera {

namespace {

// The payload's type URL; its value is unused.
constexpr absl::string_view kRankLocalUrl = "tessera/rank-local";

}  // namespace

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(),
                         absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    annotated.SetPayload(url, payload);
  });
  return annotated;
}

absl::Status RankLocal(absl::Status status) {
  if (!status.ok()) status.SetPayload(kRankLocalUrl, absl::Cord("1"));
  return status;
}

bool IsRankLocal(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kRankLocalUrl).has_value();
}

}  // namespace tessera
