// contract.h — checks, at compile time, that the enums generated from kiln.fbs agree
// with the tables they mirror (formats/encodings.def, formats/ops.def). Included by
// both sides of the contract (the compiler's writer and the runtime's reader), so a
// table edited without the schema (or the reverse) does not build.
#ifndef KILN_FORMATS_CONTRACT_H_
#define KILN_FORMATS_CONTRACT_H_

#include "formats/encoding.h"
#include "formats/kiln_format.h"
#include "formats/kiln_generated.h"

namespace kiln::format {

#define KILN_ENCODING(name, id, label, bits, quantized)                                   \
  static_assert(static_cast<uint8_t>(fb::Encoding::name) == id,                            \
                "formats/encodings.def and kiln.fbs disagree on encoding " #name);
#include "formats/encodings.def"
#undef KILN_ENCODING
static_assert(static_cast<uint8_t>(fb::Encoding::MAX) + 1 == kNumEncodings,
              "kiln.fbs has encodings that formats/encodings.def lacks");

#define KILN_OP(kind, id, mlir, in_min, in_max, w_min, w_max, params, in_place, quant, act8) \
  static_assert(static_cast<uint16_t>(fb::OpKind::kind) == id,                               \
                "formats/ops.def and kiln.fbs disagree on op " #kind);
#include "formats/ops.def"
#undef KILN_OP
static_assert(static_cast<size_t>(fb::OpKind::MAX) + 1 == 0
#define KILN_OP(kind, id, mlir, in_min, in_max, w_min, w_max, params, in_place, quant, act8) +1
#include "formats/ops.def"
#undef KILN_OP
              , "kiln.fbs has op kinds that formats/ops.def lacks");

// The parameter table an op kind carries (formats/ops.def).
inline fb::OpParams ParamsOf(fb::OpKind kind) {
  switch (kind) {
#define KILN_OP(kind, id, mlir, in_min, in_max, w_min, w_max, params, in_place, quant, act8) \
  case fb::OpKind::kind: return fb::OpParams::params;
#include "formats/ops.def"
#undef KILN_OP
  }
  return fb::OpParams::NONE;
}

}  // namespace kiln::format

#endif  // KILN_FORMATS_CONTRACT_H_
