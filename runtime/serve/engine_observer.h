// EngineObserver: what an AsyncEngine reports, as it happens, to a metrics
// recorder (ServingMetrics, metrics.h): engine steps, generated tokens and
// the end of each request, with vLLM's per-request phases.
//
// Times are seconds on the steady clock:
//   arrival    the HTTP request's arrival (AsyncEngine::SubmitGroup's
//              `arrival`; its call when none is given)
//   submitted  the SubmitGroup call (after parsing and tokenization)
//   scheduled  the first engine step that ran the request
//   first / last token
// and a request's phases are vLLM's:
//   e2e        arrival -> its end
//   queue      submitted -> scheduled (waiting for admission, then in the
//              scheduler's queue); a request that never ran: until its end
//   prefill    scheduled -> first token
//   decode     first token -> its end (the last token, or the cancellation)
//   inference  prefill + decode
//   TTFT       arrival -> first token; ITL: between consecutive tokens.
#ifndef TESSERA_RUNTIME_SERVE_ENGINE_OBSERVER_H_
#define TESSERA_RUNTIME_SERVE_ENGINE_OBSERVER_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace tessera {

// One engine request (one prompt x choice) that has ended.
struct RequestEnd {
  // "stop", "length" or "abort" (FinishReasonName), or "error": the request
  // failed (its result is an error: a failed step, a drain deadline, an
  // engine failure); then only e2e_seconds and the token counts are known
  // and has_phases is false.
  absl::string_view finish_reason;
  bool has_phases = false;
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t max_tokens = 0;  // The request's max_tokens parameter.
  double e2e_seconds = 0;
  double queue_seconds = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// Calls come from the AsyncEngine's loop thread, and OnRequestEnd also from
// whichever thread ends a request (AsyncEngine::Abort) with the engine's lock
// held: implementations must be thread-safe and cheap, and must not call
// back into the AsyncEngine.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  // An engine step ran `tokens` tokens (prompt chunks plus decodes; > 0).
  virtual void OnStep(int64_t tokens) = 0;
  // A request's first generated token, `ttft_seconds` after its arrival;
  // its prompt has `prompt_tokens` tokens.
  virtual void OnFirstToken(int64_t prompt_tokens, double ttft_seconds) = 0;
  // Any later token, `itl_seconds` after the request's previous one.
  virtual void OnNextToken(double itl_seconds) = 0;
  // Once per accepted request, however it ended.
  virtual void OnRequestEnd(const RequestEnd& end) = 0;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_ENGINE_OBSERVER_H_
