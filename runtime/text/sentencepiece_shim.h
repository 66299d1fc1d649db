// A thin, abseil-free facade over SentencePiece.
//
// Debian's sentencepiece_processor.h declares its own `absl::string_view`,
// which collides with real abseil. Only sentencepiece_shim.cc includes it, and
// that file includes no abseil header; everything else talks to SentencePiece
// through this interface.
#ifndef TESSERA_RUNTIME_TEXT_SENTENCEPIECE_SHIM_H_
#define TESSERA_RUNTIME_TEXT_SENTENCEPIECE_SHIM_H_

#include <memory>
#include <string>
#include <vector>

namespace tessera {

class SentencePieceShim {
 public:
  SentencePieceShim();
  ~SentencePieceShim();

  // Each returns false and fills *error on failure.
  bool Load(const std::string& path, std::string* error);
  // From a model file's bytes (read by the caller, who checks the file).
  bool LoadFromBytes(const std::string& bytes, std::string* error);
  bool Encode(const std::string& text, std::vector<int>* ids,
              std::string* error) const;
  bool Decode(const std::vector<int>& ids, std::string* text,
              std::string* error) const;

  int PieceSize() const;
  // Control pieces (<s>, </s>) and the unknown piece's status, and piece <-> id
  // lookups.
  bool IsControl(int id) const;
  std::string IdToPiece(int id) const;
  int PieceToId(const std::string& piece) const;  // The unknown id when absent.
  int UnkId() const;
  int BosId() const;
  int EosId() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_SENTENCEPIECE_SHIM_H_
