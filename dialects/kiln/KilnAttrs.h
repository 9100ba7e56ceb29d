//===- KilnAttrs.h - kiln dialect attributes ---------------------*- C++ -*-===//
#ifndef KILN_DIALECTS_KILN_KILNATTRS_H
#define KILN_DIALECTS_KILN_KILNATTRS_H

#include <optional>

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/Hashing.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/bit.h"

#include "dialects/kiln/KilnEnums.h.inc"

#include "dialects/kiln/KilnAttrInterfaces.h.inc"

namespace kiln {
// A double parameter of an attribute (attribute storage hashes its parameters, and
// LLVM has no hash for double): equal and hashed by its bits, converts to double.
struct F64 {
  double value = 0;
  F64() = default;
  F64(double v) : value(v) {}
  operator double() const { return value; }
  friend bool operator==(F64 a, F64 b) { return llvm::bit_cast<uint64_t>(a.value) == llvm::bit_cast<uint64_t>(b.value); }
  friend bool operator!=(F64 a, F64 b) { return !(a == b); }
  friend llvm::hash_code hash_value(F64 v) { return llvm::hash_value(llvm::bit_cast<uint64_t>(v.value)); }
};

// Parameters of the module configuration attributes: doubles printed to read back
// exactly, lists in brackets.
mlir::FailureOr<F64> parseF64Parameter(mlir::AsmParser& parser);
void printF64Parameter(mlir::AsmPrinter& printer, F64 value);
template <typename T>
mlir::FailureOr<llvm::SmallVector<T>> parseListParameter(mlir::AsmParser& parser) {
  llvm::SmallVector<T> values;
  auto element = [&]() -> mlir::ParseResult {
    if constexpr (std::is_same_v<T, F64>) {
      mlir::FailureOr<F64> v = parseF64Parameter(parser);
      if (mlir::failed(v))
        return mlir::failure();
      values.push_back(*v);
      return mlir::success();
    } else {
      T v;
      if (parser.parseInteger(v))
        return mlir::failure();
      values.push_back(v);
      return mlir::success();
    }
  };
  if (parser.parseCommaSeparatedList(mlir::AsmParser::Delimiter::Square, element))
    return mlir::failure();
  return values;
}
template <typename T>
void printListParameter(mlir::AsmPrinter& printer, llvm::ArrayRef<T> values) {
  printer << '[';
  llvm::interleaveComma(values, printer, [&](T v) {
    if constexpr (std::is_same_v<T, F64>)
      printF64Parameter(printer, v);
    else
      printer << v;
  });
  printer << ']';
}
} // namespace kiln

#define GET_ATTRDEF_CLASSES
#include "dialects/kiln/KilnAttrs.h.inc"

namespace kiln {

/// The leaf sources of a weight expression, depth first, operands in order (a
/// source read twice appears twice). The one walk over an expression's leaves:
/// the artifact writer, calibration and the precision report use it.
llvm::SmallVector<SourceAttr> getWeightSources(mlir::Attribute expr);

/// Total bytes of the leaves of a weight expression (a source read twice counts
/// twice): the "source bytes" of the precision report.
uint64_t getWeightSourceBytes(mlir::Attribute expr);

/// The transforms of a weight expression as text (its printed form), "" for a
/// plain source. Hashes of a module's weights (the artifact's source hash, the
/// calibration cache's key) take it beside the leaves' bytes: two expressions over
/// the same leaves (a slice at another offset, a weighted sum with other
/// coefficients) hash apart.
std::string weightExprTransforms(mlir::Attribute expr);

/// Bytes of one element of a safetensors dtype: 4 (F32), 2 (F16, BF16), or 0 for
/// any other.
unsigned safetensorsDtypeBytes(llvm::StringRef dtype);

/// Checks one node of a weight expression (the attribute verifiers, and
/// WeightOp::verify for attributes built without them). `expr` must implement
/// WeightExprAttrInterface; operands are checked as far as this node needs them
/// (their shape and dtype), not recursively.
mlir::LogicalResult verifyWeightExprNode(llvm::function_ref<mlir::InFlightDiagnostic()> emitError,
                                         mlir::Attribute expr);

} // namespace kiln

#endif // KILN_DIALECTS_KILN_KILNATTRS_H
