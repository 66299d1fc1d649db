#include "runtime/model/safetensors.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/core/model_file.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

// The safetensors reference implementation refuses headers above 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

absl::Status FileError(const std::string& path, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors file ", path, ": ", message));
}

absl::Status TensorError(const std::string& path, absl::string_view tensor,
                         absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(
      "safetensors file ", path, ": tensor \"", tensor, "\": ", message));
}

// Reads an integer JSON value that must be >= 0 and fit int64_t.
bool AsNonNegative(const Json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return *out <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

absl::StatusOr<Json> ParseJsonText(absl::string_view text,
                                   const std::string& path) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return FileError(path,
                     absl::StrCat("malformed JSON (or a wrong header length "
                                  "field): ",
                                  e.what()));
  }
}

}  // namespace

// One read-only memory mapping of a validated safetensors file. The mapping
// is released on destruction; the file descriptor is closed as soon as the
// mapping exists (the mapping keeps the file alive).
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile() {
    if (map_ != nullptr) ::munmap(map_, map_size_);
  }

  const std::string& path() const { return path_; }
  // The validated tensors, sorted by name.
  const std::map<std::string, TensorInfo, std::less<>>& tensors() const {
    return tensors_;
  }

 private:
  explicit SafetensorsFile(std::string path) : path_(std::move(path)) {}
  absl::Status Validate();

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorInfo, std::less<>> tensors_;
};

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path));
  // Not a plain open(): a FIFO named model.safetensors would block it forever.
  uint64_t size = 0;
  absl::StatusOr<ScopedFd> fd = OpenRegularFile(path, &size);
  if (!fd.ok()) return fd.status();  // Names the file and what it is.
  if (size < 8) {
    return FileError(path,
                     absl::StrCat("file is ", size,
                                  " bytes, too short for the 8-byte header "
                                  "length"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd->get(), 0);
  if (map == MAP_FAILED) {
    return ErrnoError(errno, absl::StrCat("cannot mmap ", path));
  }
  file->map_ = map;
  file->map_size_ = size;
  RETURN_IF_ERROR(file->Validate());
  return file;
}

absl::Status SafetensorsFile::Validate() {
  const auto* bytes = static_cast<const unsigned char*>(map_);
  const uint64_t file_size = map_size_;
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > file_size - 8) {
    return FileError(path_, absl::StrCat("header length ", header_len,
                                         " exceeds the file size ", file_size,
                                         " (truncated or not safetensors)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return FileError(path_, absl::StrCat("header length ", header_len,
                                         " exceeds the limit of ",
                                         kMaxHeaderBytes, " bytes"));
  }
  const absl::string_view header_text(reinterpret_cast<const char*>(bytes + 8),
                                      header_len);
  ASSIGN_OR_RETURN(const Json header, ParseJsonText(header_text, path_));
  if (!header.is_object()) {
    return FileError(path_, "header is not a JSON object");
  }
  // The JSON object must fill the header exactly: it starts at byte 8 and
  // ends at the header's end, where writers may pad with spaces only. A
  // length field a few bytes short (cutting the padding) or long (taking in
  // data bytes) would otherwise still parse and shift every tensor.
  const size_t json_end = header_text.find_last_not_of(' ');
  if (header_text.empty() || header_text.front() != '{' ||
      json_end == absl::string_view::npos || header_text[json_end] != '}') {
    return FileError(
        path_, absl::StrCat("the header of ", header_len,
                            " bytes (the length field) does not hold exactly "
                            "one JSON object padded with spaces: wrong length "
                            "field or not safetensors"));
  }
  const unsigned char* data = bytes + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  struct Extent {
    uint64_t begin;
    uint64_t end;
    const std::string* name;
  };
  std::vector<Extent> extents;
  for (const auto& item : header.items()) {
    const std::string& name = item.key();
    if (name == "__metadata__") continue;
    const Json& entry = item.value();
    if (!entry.is_object()) {
      return TensorError(path_, name, "entry is not a JSON object");
    }
    auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return TensorError(path_, name, "missing or non-string \"dtype\"");
    }
    absl::StatusOr<DType> dtype =
        DTypeFromSafetensors(dtype_it->get<std::string>());
    if (!dtype.ok()) return TensorError(path_, name, dtype.status().message());

    auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return TensorError(path_, name, "missing or non-list \"shape\"");
    }
    std::vector<int64_t> dims;
    uint64_t numel = 1;
    bool overflow = false;
    for (const Json& d : *shape_it) {
      uint64_t dim;
      if (!AsNonNegative(d, &dim)) {
        return TensorError(path_, name,
                           absl::StrCat("invalid dimension ", d.dump(),
                                        " in shape ", shape_it->dump()));
      }
      dims.push_back(static_cast<int64_t>(dim));
      overflow |= __builtin_mul_overflow(numel, dim, &numel);
    }
    uint64_t nbytes = 0;
    overflow |= __builtin_mul_overflow(numel, DTypeSize(*dtype), &nbytes);
    if (overflow) {
      return TensorError(
          path_, name,
          absl::StrCat("shape ", shape_it->dump(), " has too many elements"));
    }

    auto offsets_it = entry.find("data_offsets");
    uint64_t begin = 0, end = 0;
    if (offsets_it == entry.end() || !offsets_it->is_array() ||
        offsets_it->size() != 2 || !AsNonNegative((*offsets_it)[0], &begin) ||
        !AsNonNegative((*offsets_it)[1], &end)) {
      return TensorError(
          path_, name,
          "\"data_offsets\" must be a list of two non-negative integers");
    }
    if (begin > end || end > data_size) {
      return TensorError(
          path_, name,
          absl::StrCat("data_offsets [", begin, ", ", end,
                       "] outside the data region of ", data_size, " bytes"));
    }
    if (end - begin != nbytes) {
      return TensorError(
          path_, name,
          absl::StrCat("data_offsets [", begin, ", ", end, "] span ",
                       end - begin, " bytes but ", dtype_it->get<std::string>(),
                       " shape ", shape_it->dump(), " needs ", nbytes));
    }

    TensorInfo info;
    info.name = name;
    info.dtype = *dtype;
    info.shape = Shape(absl::MakeConstSpan(dims));
    info.data = data + begin;
    info.nbytes = static_cast<size_t>(nbytes);
    info.file = path_;
    auto [it, inserted] = tensors_.emplace(name, std::move(info));
    extents.push_back({begin, end, &it->first});
  }

  // Like the reference implementation, the tensors must tile the data region
  // exactly: sorted by offset, the first begins at 0, each begins where the
  // one before ended (empty tensors included), the last ends at the region's
  // end. A gap, an overlap or a tail means a header that does not describe
  // this data (a shifted header fails here even when every extent fits).
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t covered = 0;
  const Extent* prev = nullptr;
  for (const Extent& cur : extents) {
    if (cur.begin < covered) {
      return FileError(
          path_, absl::StrCat("tensors \"", *prev->name, "\" [", prev->begin,
                              ", ", prev->end, ") and \"", *cur.name, "\" [",
                              cur.begin, ", ", cur.end, ") overlap"));
    }
    if (cur.begin > covered) {
      return FileError(
          path_, absl::StrCat(
                     "bytes [", covered, ", ", cur.begin,
                     ") of the data region belong to no tensor (before \"",
                     *cur.name, "\"): the header does not describe the data"));
    }
    covered = cur.end;
    prev = &cur;
  }
  if (covered != data_size) {
    return FileError(path_, absl::StrCat("the tensors cover ", covered,
                                         " bytes of the data "
                                         "region of ",
                                         data_size,
                                         " bytes (wrong header length "
                                         "field, truncated or trailing data)"));
  }
  return absl::OkStatus();
}

struct Checkpoint::Impl {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  // Points into `files`.
  std::map<std::string, const TensorInfo*, std::less<>> tensors;

  // Adds every tensor of `file`; a name already seen is an error.
  absl::Status Add(std::unique_ptr<SafetensorsFile> file) {
    files.push_back(std::move(file));
    for (const auto& [name, info] : files.back()->tensors()) {
      auto [it, inserted] = tensors.emplace(name, &info);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", name, "\" appears in both ",
                         it->second->file, " and ", info.file));
      }
    }
    return absl::OkStatus();
  }
};

Checkpoint::Checkpoint() : impl_(std::make_unique<Impl>()) {}
Checkpoint::~Checkpoint() = default;

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::OpenFile(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                   SafetensorsFile::Open(path));
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  RETURN_IF_ERROR(checkpoint->impl_->Add(std::move(file)));
  return checkpoint;
}

namespace {

// Reads model.safetensors.index.json: tensor name -> shard file name.
absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(
    const std::string& index_path) {
  ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(index_path));
  Json index;
  try {
    index = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": malformed JSON: ", e.what()));
  }
  if (!index.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": not a JSON object"));
  }
  auto weight_map = index.find("weight_map");
  if (weight_map == index.end() || !weight_map->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": missing or non-object \"weight_map\""));
  }
  std::map<std::string, std::string> result;
  for (const auto& item : weight_map->items()) {
    if (!item.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map entry for \"", item.key(),
                       "\" is not a file name"));
    }
    std::string shard = item.value().get<std::string>();
    const std::filesystem::path shard_path(shard);
    bool escapes = shard.empty() || shard_path.is_absolute();
    for (const auto& part : shard_path) escapes |= part == "..";
    if (escapes) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map entry for \"", item.key(),
                       "\" names an invalid shard \"", shard, "\""));
    }
    result.emplace(item.key(), std::move(shard));
  }
  return result;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(
    const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("model directory ", dir, " does not exist"));
  }
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, " is not a directory"));
  }
  const fs::path root(dir);

  const std::string index_path =
      (root / "model.safetensors.index.json").string();
  if (fs::exists(index_path, ec)) {
    ASSIGN_OR_RETURN(const auto weight_map, ReadWeightMap(index_path));
    std::set<std::string> shards;
    for (const auto& [name, shard] : weight_map) shards.insert(shard);
    std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
    for (const std::string& shard : shards) {
      const std::string shard_path = (root / shard).string();
      if (!fs::exists(shard_path, ec)) {
        return absl::NotFoundError(absl::StrCat(index_path, " names shard ",
                                                shard, ", but ", shard_path,
                                                " does not exist"));
      }
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                       SafetensorsFile::Open(shard_path));
      RETURN_IF_ERROR(checkpoint->impl_->Add(std::move(file)));
    }
    for (const auto& [name, shard] : weight_map) {
      auto it = checkpoint->impl_->tensors.find(name);
      const std::string shard_path = (root / shard).string();
      if (it == checkpoint->impl_->tensors.end() ||
          it->second->file != shard_path) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, " maps tensor \"", name, "\" to ", shard,
                         ", but ", shard_path, " has no such tensor"));
      }
    }
    return checkpoint;
  }

  const std::string single = (root / "model.safetensors").string();
  if (fs::exists(single, ec)) return OpenFile(single);

  std::vector<std::string> paths;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->path().extension() == ".safetensors" && it->is_regular_file(ec)) {
      paths.push_back(it->path().string());
    }
  }
  if (ec) {
    return ErrnoError(ec.value(), absl::StrCat("cannot list ", dir));
  }
  if (paths.empty()) {
    return absl::NotFoundError(absl::StrCat("no .safetensors files in ", dir));
  }
  std::sort(paths.begin(), paths.end());
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                     SafetensorsFile::Open(path));
    RETURN_IF_ERROR(checkpoint->impl_->Add(std::move(file)));
  }
  return checkpoint;
}

bool Checkpoint::Has(absl::string_view name) const {
  return impl_->tensors.find(name) != impl_->tensors.end();
}

absl::StatusOr<TensorInfo> Checkpoint::Get(absl::string_view name) const {
  auto it = impl_->tensors.find(name);
  if (it == impl_->tensors.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor \"", name, "\" not found in checkpoint"));
  }
  return *it->second;
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(impl_->tensors.size());
  for (const auto& [name, info] : impl_->tensors) names.push_back(name);
  return names;
}

absl::StatusOr<Tensor> Checkpoint::LoadF32(absl::string_view name,
                                           const Shape& expected) const {
  ASSIGN_OR_RETURN(const TensorInfo info, Get(name));
  if (info.shape != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": expected shape ", expected.ToString(),
                     ", found ", info.shape.ToString()));
  }
  if (!IsFloatConvertible(info.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " in ", info.file, " has dtype ",
                     DTypeName(info.dtype), ", which cannot be read as f32"));
  }
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(DType::kF32, info.shape));
  const size_t count = static_cast<size_t>(info.shape.numel());
  const void* src = info.data;
  // Offsets in the file need not be aligned to the element size; the widening
  // loops read typed pointers, so copy misaligned data first.
  std::vector<unsigned char> aligned;
  if (reinterpret_cast<uintptr_t>(src) % DTypeSize(info.dtype) != 0) {
    aligned.assign(static_cast<const unsigned char*>(src),
                   static_cast<const unsigned char*>(src) + info.nbytes);
    src = aligned.data();
  }
  absl::Status status =
      ConvertToF32(info.dtype, src, count, out.data_as<float>());
  if (!status.ok()) return Annotate(status, absl::StrCat("tensor ", name));
  return out;
}

}  // namespace tessera
