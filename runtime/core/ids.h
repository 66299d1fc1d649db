// The ids that rank 0's engine, scheduler and block manager hand each other,
// and that the StepPlan carries to the other ranks.
//
// They are plain aliases, not strong types, on purpose: each has exactly one
// integer type it is stored and sent in (the proto fields, the flat arrays of
// the block manager, the model's int32 token inputs), and a strong type would
// need a cast at every one of those places, in the tests, and in serve/launch
// code that prints and parses them, for little gain, since the three never
// mix in one signature today. The names say which id a parameter is; the
// widths below are the contract.
#ifndef TESSERA_RUNTIME_CORE_IDS_H_
#define TESSERA_RUNTIME_CORE_IDS_H_

#include <cstdint>

namespace tessera {

// A sequence (the engine's request id: one sequence per request). Positive
// when the engine hands it out; sent as uint64 (SequenceStep.sequence_id).
using SeqId = int64_t;

// A vocabulary entry, as tokenizers, the sampler and the model's inputs hold
// it (int32 on the wire and on the device).
using TokenId = int32_t;

// A KV-cache block of block_size tokens, an index into the rank's KV pool
// (int32 in SequenceStep.block_table; the block manager bounds the pool
// below 2^31 blocks).
using BlockId = int32_t;

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_IDS_H_
