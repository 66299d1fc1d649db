#include "tests/testing/safetensors_writer.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

void SafetensorsWriter::Add(absl::string_view name, DType dtype,
                            const Shape& shape, std::string bytes) {
  Remove(name);
  entries_.push_back({std::string(name), dtype, shape, std::move(bytes)});
}

void SafetensorsWriter::AddF32(absl::string_view name, const Shape& shape,
                               const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  Add(name, DType::kF32, shape, std::move(bytes));
}

void SafetensorsWriter::AddCopy(const TensorInfo& info) {
  AddCopy(info, info.shape);
}

void SafetensorsWriter::AddCopy(const TensorInfo& info, const Shape& shape) {
  Add(info.name, info.dtype, shape,
      std::string(static_cast<const char*>(info.data), info.nbytes));
}

bool SafetensorsWriter::Remove(absl::string_view name) {
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.name == name; });
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

absl::Status SafetensorsWriter::Write(const std::string& path) const {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const Entry& e : entries_) {
    const uint64_t expected =
        static_cast<uint64_t>(e.shape.numel()) * DTypeSize(e.dtype);
    if (e.bytes.size() != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", e.name, ": ", e.bytes.size(),
                       " bytes for shape ", e.shape.ToString(), " of ",
                       DTypeToSafetensors(e.dtype), " (need ", expected, ")"));
    }
    header[e.name] = {
        {"dtype", std::string(DTypeToSafetensors(e.dtype))},
        {"shape",
         std::vector<int64_t>(e.shape.dims().begin(), e.shape.dims().end())},
        {"data_offsets", {data.size(), data.size() + e.bytes.size()}}};
    data += e.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) {
    prefix[i] = static_cast<char>(
        (static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << prefix << text << data;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

SafetensorsWriter CopyOf(const Checkpoint& checkpoint) {
  SafetensorsWriter writer;
  for (const std::string& name : checkpoint.Names()) {
    absl::StatusOr<TensorInfo> info = checkpoint.Get(name);
    if (info.ok()) writer.AddCopy(*info);
  }
  return writer;
}

}  // namespace tessera
