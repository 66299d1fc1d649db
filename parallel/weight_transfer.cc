#include "parallel/weight_transfer.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/tessera.pb.h"
#include "runtime/core/status.h"

namespace tessera {

absl::Status SendWeight(const ChunkSink& sink, int32_t index,
                        const std::string& name, const TensorView& host,
                        bool last, int64_t chunk_bytes) {
  if (chunk_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk size ", chunk_bytes, " must be positive"));
  }
  proto::ShardChunk chunk;
  const int64_t bytes = static_cast<int64_t>(host.nbytes());
  for (int64_t offset = 0; offset == 0 || offset < bytes;
       offset += chunk_bytes) {
    const int64_t n = std::min(chunk_bytes, bytes - offset);
    chunk.Clear();
    chunk.set_index(index);
    chunk.set_name(name);
    for (int64_t d : host.shape().dims()) chunk.add_shape(d);
    chunk.set_dtype(std::string(DTypeToSafetensors(host.dtype())));
    chunk.set_byte_offset(offset);
    chunk.set_data(static_cast<const char*>(host.data()) + offset, n);
    chunk.set_last(last && offset + n >= bytes);
    RETURN_IF_ERROR(sink(chunk));
    if (bytes == 0) break;
  }
  return absl::OkStatus();
}

absl::Status SendShard(const ChunkSink& sink, const Checkpoint& checkpoint,
                       const WeightTable& table,
                       const std::function<void()>& on_part,
                       int64_t chunk_bytes) {
  if (table.empty()) {
    return absl::InvalidArgumentError("SendShard: the shard has no tensors");
  }
  HostStaging staging;
  for (size_t i = 0; i < table.size(); ++i) {
    const WeightSpec& spec = table[i];
    ASSIGN_OR_RETURN(const TensorView host,
                     ReadSlice(checkpoint, spec, &staging));
    RETURN_IF_ERROR(SendWeight(sink, static_cast<int32_t>(i), spec.name, host,
                               i + 1 == table.size(), chunk_bytes));
    const bool part_done =
        i + 1 == table.size() || table[i + 1].part != spec.part;
    if (part_done && on_part) on_part();
  }
  return absl::OkStatus();
}

absl::Status SendShard(ControlChannel& control, const Checkpoint& checkpoint,
                       const WeightTable& table, int dest,
                       const std::function<void()>& on_part) {
  return SendShard(
      [&control, dest](const proto::ShardChunk& chunk) {
        return control.Send(chunk, dest, kShardTag);
      },
      checkpoint, table, on_part);
}

absl::StatusOr<WeightSet> ReceiveShard(const ChunkSource& source,
                                       WeightTable table, Ops* ops,
                                       DType matrix_dtype) {
  WeightSet set(std::move(table));
  if (set.size() == 0) {
    return absl::InvalidArgumentError("ReceiveShard: the shard has no tensors");
  }
  // Tensors arrive in table order, each as chunks with increasing offsets. A
  // tensor in one chunk is stored from the message itself; a larger one is
  // assembled in `staging` first.
  HostStaging staging;
  proto::ShardChunk chunk;
  size_t next = 0;       // The tensor being received.
  int64_t received = 0;  // Its bytes so far.
  while (true) {
    RETURN_IF_ERROR(source(&chunk));
    if (next >= set.size() || chunk.index() != static_cast<int32_t>(next)) {
      return absl::DataLossError(absl::StrCat(
          "weight chunk for tensor #", chunk.index(), " (", chunk.name(),
          "): expected tensor #", next, " of this shard's ", set.size()));
    }
    const WeightSpec& spec = set.table()[next];
    const Shape shape(
        absl::MakeConstSpan(chunk.shape().data(), chunk.shape_size()));
    absl::StatusOr<DType> dtype =
        DTypeFromSafetensors(chunk.dtype().empty() ? "F32" : chunk.dtype());
    const int64_t data = static_cast<int64_t>(chunk.data().size());
    const int64_t total = dtype.ok() && IsFloatConvertible(*dtype)
                              ? SliceBytes(spec, *dtype)
                              : -1;
    if (chunk.name() != spec.name || shape != spec.local_shape() || total < 0 ||
        chunk.byte_offset() != received || received + data > total) {
      return absl::DataLossError(absl::StrCat(
          "weight chunk ", chunk.name(), " ", shape.ToString(), " ",
          chunk.dtype(), " at byte ", chunk.byte_offset(),
          " does not fit tensor ", spec.name, " ",
          spec.local_shape().ToString(), " (", received, " bytes received)"));
    }
    const bool whole = received == 0 && data == total;
    if (!whole) {
      ASSIGN_OR_RETURN(void* buffer,
                       staging.Reserve(static_cast<size_t>(total)));
      std::memcpy(static_cast<char*>(buffer) + received, chunk.data().data(),
                  chunk.data().size());
    }
    received += data;
    if (received == total) {
      const void* bytes = whole ? static_cast<const void*>(chunk.data().data())
                                : static_cast<const void*>(*staging.Reserve(
                                      static_cast<size_t>(total)));
      const TensorView host(const_cast<void*>(bytes), *dtype,
                            spec.local_shape());
      RETURN_IF_ERROR(set.Store(next, host, ops, matrix_dtype));
      ++next;
      received = 0;
    }
    if (chunk.last()) {
      if (next != set.size() || received != 0) {
        return absl::DataLossError(absl::StrCat("the weight shard ended after ",
                                                next, " of its ", set.size(),
                                                " tensors"));
      }
      return set;
    }
  }
}

absl::StatusOr<WeightSet> ReceiveShard(ControlChannel& control,
                                       WeightTable table, Ops* ops,
                                       DType matrix_dtype) {
  return ReceiveShard(
      [&control](proto::ShardChunk* chunk) {
        return control.Recv(0, kShardTag, chunk);
      },
      std::move(table), ops, matrix_dtype);
}

absl::Status SendShard(ControlChannel& control, LlamaWeights& weights,
                       int dest) {
  std::vector<std::pair<std::string, Tensor*>> tensors;
  ForEachWeight(&weights, [&](const std::string& name, Tensor* t) {
    tensors.emplace_back(name, t);
  });
  proto::ShardChunk chunk;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = *tensors[i].second;
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    for (int64_t offset = 0; offset == 0 || offset < bytes;
         offset += kShardChunkBytes) {
      const int64_t n = std::min(kShardChunkBytes, bytes - offset);
      chunk.Clear();
      chunk.set_index(static_cast<int32_t>(i));
      chunk.set_name(tensors[i].first);
      for (int64_t d : t.shape().dims()) chunk.add_shape(d);
      chunk.set_byte_offset(offset);
      chunk.set_data(static_cast<const char*>(t.data()) + offset, n);
      chunk.set_last(i + 1 == tensors.size() && offset + n >= bytes);
      RETURN_IF_ERROR(control.Send(chunk, dest, kShardTag));
      if (bytes == 0) break;
    }
  }
  return absl::OkStatus();
}

absl::Status ReceiveShard(ControlChannel& control, LlamaWeights& weights) {
  std::vector<std::pair<std::string, Tensor*>> tensors;
  ForEachWeight(&weights, [&](const std::string& name, Tensor* t) {
    tensors.emplace_back(name, t);
  });
  proto::ShardChunk chunk;
  while (true) {
    RETURN_IF_ERROR(control.Recv(0, kShardTag, &chunk));
    if (chunk.index() < 0 ||
        chunk.index() >= static_cast<int32_t>(tensors.size())) {
      return absl::DataLossError(absl::StrCat(
          "weight chunk for tensor #", chunk.index(), " (", chunk.name(),
          "): this shard has ", tensors.size(), " tensors"));
    }
    Tensor& t = *tensors[chunk.index()].second;
    const Shape shape(
        absl::MakeConstSpan(chunk.shape().data(), chunk.shape_size()));
    if (chunk.name() != tensors[chunk.index()].first || shape != t.shape() ||
        chunk.byte_offset() < 0 ||
        chunk.byte_offset() + static_cast<int64_t>(chunk.data().size()) >
            static_cast<int64_t>(t.nbytes())) {
      return absl::DataLossError(absl::StrCat(
          "weight chunk ", chunk.name(), " ", shape.ToString(), " at byte ",
          chunk.byte_offset(), " does not fit tensor ",
          tensors[chunk.index()].first, " ", t.shape().ToString()));
    }
    std::memcpy(static_cast<char*>(t.data()) + chunk.byte_offset(),
                chunk.data().data(), chunk.data().size());
    if (chunk.last()) return absl::OkStatus();
  }
}

}  // namespace tessera
