// No abseil headers in this file: see sentencepiece_shim.h.
#include "runtime/text/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

namespace tessera {

struct SentencePieceShim::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

SentencePieceShim::SentencePieceShim() : impl_(std::make_unique<Impl>()) {}
SentencePieceShim::~SentencePieceShim() = default;

bool SentencePieceShim::Load(const std::string& path, std::string* error) {
  const auto status = impl_->processor.Load(path);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool SentencePieceShim::LoadFromBytes(const std::string& bytes,
                                      std::string* error) {
  const auto status = impl_->processor.LoadFromSerializedProto(bytes);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool SentencePieceShim::Encode(const std::string& text, std::vector<int>* ids,
                               std::string* error) const {
  const auto status = impl_->processor.Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool SentencePieceShim::Decode(const std::vector<int>& ids, std::string* text,
                               std::string* error) const {
  const auto status = impl_->processor.Decode(ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

int SentencePieceShim::PieceSize() const {
  return impl_->processor.GetPieceSize();
}
bool SentencePieceShim::IsControl(int id) const {
  return impl_->processor.IsControl(id);
}
std::string SentencePieceShim::IdToPiece(int id) const {
  return impl_->processor.IdToPiece(id);
}
int SentencePieceShim::PieceToId(const std::string& piece) const {
  return impl_->processor.PieceToId(piece);
}
int SentencePieceShim::UnkId() const { return impl_->processor.unk_id(); }
int SentencePieceShim::BosId() const { return impl_->processor.bos_id(); }
int SentencePieceShim::EosId() const { return impl_->processor.eos_id(); }

}  // namespace tessera
