// Tessera's version, as GET /version and `tessera --version` report it.
#ifndef TESSERA_RUNTIME_SERVE_VERSION_H_
#define TESSERA_RUNTIME_SERVE_VERSION_H_

namespace tessera {

inline constexpr char kTesseraVersion[] = "0.1.0";

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_VERSION_H_
