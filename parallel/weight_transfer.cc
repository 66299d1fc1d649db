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
