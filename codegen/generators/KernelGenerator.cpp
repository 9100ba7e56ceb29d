//===- KernelGenerator.cpp - kernels generated for one model -----*- C++ -*-===//
#include "codegen/generators/KernelGenerator.h"

#include <cstddef>
#include <map>

#include "codegen/selection/KernelRegistry.h"
#include "dialects/kiln/KilnOps.h"
#include "formats/kiln_format.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVMPass.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "passes/Encoding.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "formats/ukernel_abi.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/BinaryFormat/ELF.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Object/ELFObjectFile.h"
#include "llvm/Object/ObjectFile.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"

namespace kiln {

using mlir::Value;

void setModuleTarget(mlir::ModuleOp module, const Target& target) {
  mlir::Builder b(module.getContext());
  module->setAttr(kTargetAttrName,
                  b.getDictionaryAttr({b.getNamedAttr("triple", b.getStringAttr(target.triple)),
                                       b.getNamedAttr("features", b.getStringAttr(featureList(target.features))),
                                       b.getNamedAttr("generate", b.getBoolAttr(target.generate))}));
}

llvm::Expected<Target> moduleTarget(mlir::ModuleOp module) {
  auto dict = module->getAttrOfType<mlir::DictionaryAttr>(kTargetAttrName);
  if (!dict)
    return parseTarget("", "");
  auto triple = dict.getAs<mlir::StringAttr>("triple");
  auto features = dict.getAs<mlir::StringAttr>("features");
  auto generate = dict.getAs<mlir::BoolAttr>("generate");
  if (!triple || !features || !generate)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "module attribute kiln.target needs triple, features (strings) and "
                                   "generate (bool)");
  std::string list;
  for (llvm::StringRef f : llvm::split(features.getValue(), ','))
    if (!f.empty())
      list += "+" + f.str() + ",";
  auto target = parseTarget(triple.getValue(), list);
  if (target)
    target->generate = generate.getValue();
  return target;
}

namespace {

void initLLVMTargets() {
  static bool done = [] {
    llvm::InitializeAllTargetInfos();
    llvm::InitializeAllTargets();
    llvm::InitializeAllTargetMCs();
    llvm::InitializeAllAsmPrinters();
    return true;
  }();
  (void)done;
}

// LLVM's names of the target's features.
std::string llvmFeatures(const Target& target) {
  std::vector<std::string> out;
  for (uint64_t b = 1; b != 0; b <<= 1) {
    if (!(target.features & b))
      continue;
    llvm::StringRef name = format::CpuFeatureName(b);
    if (name == "fp16")
      name = "fullfp16";
    out.push_back("+" + name.str());
  }
  return llvm::join(out, ",");
}

// f32 lanes of the widest vector register the target has.
int64_t vectorLanes(const Target& target) {
  if (target.arch == TargetArch::X86_64) {
    if (target.features & format::kCpuX86Avx512F)
      return 16;
    if (target.features & format::kCpuX86Avx2)
      return 8;
  }
  return 4;
}

// The ISA suffix of generated kernel names.
std::string isaSuffix(const Target& target) {
  if (target.arch == TargetArch::X86_64)
    return (target.features & format::kCpuX86Avx512F) ? "x86_avx512"
           : (target.features & format::kCpuX86Avx2)  ? "x86_avx2"
                                                       : "x86_64";
  return (target.features & format::kCpuArmSve) ? "arm_sve" : "arm_neon";
}

// Builds code inside one generated function: typed helpers over the LLVM
// dialect's pointers, arith and vector ops.
struct FnBuilder {
  mlir::OpBuilder& b;
  mlir::Location loc;
  mlir::Type f32, f64, i32, i64, ptr;

  FnBuilder(mlir::OpBuilder& builder, mlir::Location l)
      : b(builder), loc(l), f32(builder.getF32Type()), f64(builder.getF64Type()), i32(builder.getI32Type()),
        i64(builder.getI64Type()), ptr(mlir::LLVM::LLVMPointerType::get(builder.getContext())) {}

  Value cI64(int64_t v) { return b.create<mlir::arith::ConstantIntOp>(loc, v, 64); }
  Value splat(mlir::VectorType t, double v) {
    return b.create<mlir::arith::ConstantOp>(
        loc, mlir::DenseElementsAttr::get(t, llvm::ArrayRef<mlir::Attribute>{b.getFloatAttr(t.getElementType(), v)}));
  }
  Value splatInt(mlir::VectorType t, int64_t v) {
    return b.create<mlir::arith::ConstantOp>(
        loc, mlir::DenseElementsAttr::get(t, llvm::ArrayRef<mlir::Attribute>{b.getIntegerAttr(t.getElementType(), v)}));
  }
  // &base[index] for elements of `elem`.
  Value gep(Value base, mlir::Type elem, Value index) {
    return b.create<mlir::LLVM::GEPOp>(loc, ptr, elem, base, mlir::ValueRange{index});
  }
  // A field of a parameter struct at `offset` bytes.
  Value field(Value params, size_t offset, mlir::Type type) {
    Value at = b.create<mlir::LLVM::GEPOp>(loc, ptr, b.getI8Type(), params,
                                           llvm::ArrayRef<mlir::LLVM::GEPArg>{static_cast<int32_t>(offset)});
    return b.create<mlir::LLVM::LoadOp>(loc, type, at, /*alignment=*/8);
  }
  Value load(mlir::Type type, Value base, mlir::Type elem, Value index) {
    return b.create<mlir::LLVM::LoadOp>(loc, type, gep(base, elem, index), /*alignment=*/4);
  }
  void store(Value v, Value base, mlir::Type elem, Value index) {
    b.create<mlir::LLVM::StoreOp>(loc, v, gep(base, elem, index), /*alignment=*/4);
  }
  Value add(Value a, Value c) { return b.create<mlir::arith::AddFOp>(loc, a, c); }
  Value sub(Value a, Value c) { return b.create<mlir::arith::SubFOp>(loc, a, c); }
  Value mul(Value a, Value c) { return b.create<mlir::arith::MulFOp>(loc, a, c); }
  Value addi(Value a, Value c) { return b.create<mlir::arith::AddIOp>(loc, a, c); }
  Value muli(Value a, Value c) { return b.create<mlir::arith::MulIOp>(loc, a, c); }
  // for (i = lo; i < hi; i += step) body(i), over i64.
  template <typename F>
  void loop(Value lo, Value hi, Value step, F body) {
    auto f = b.create<mlir::scf::ForOp>(loc, lo, hi, step);
    mlir::OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(f.getBody());
    body(f.getInductionVar());
  }

  // sin and cos of f32 lanes, correctly rounded in practice: the angle is reduced
  // by pi/2 in f64 (exact for |x| < 2^20 * pi/2 with the two-part constant), the
  // fdlibm kernel polynomials are evaluated in f64 and rounded once to f32. No
  // library calls: the code segment must be self-contained.
  std::pair<Value, Value> sinCos(Value angle, int64_t lanes) {
    auto vf64 = mlir::VectorType::get({lanes}, f64);
    auto vf32 = mlir::VectorType::get({lanes}, f32);
    auto vi32 = mlir::VectorType::get({lanes}, i32);
    Value a = b.create<mlir::arith::ExtFOp>(loc, vf64, angle);
    // k = round(a * 2/pi) by the 1.5 * 2^52 trick (no rounding instruction needed).
    Value magic = splat(vf64, 6755399441055744.0);
    Value k = sub(add(mul(a, splat(vf64, 6.36619772367581382433e-01)), magic), magic);
    Value r = sub(sub(a, mul(k, splat(vf64, 1.57079632673412561417e+00))), mul(k, splat(vf64, 6.07710050650619224932e-11)));
    Value z = mul(r, r);
    auto poly = [&](std::initializer_list<double> c) {
      Value acc;
      for (auto it = std::rbegin(c); it != std::rend(c); ++it)
        acc = acc ? add(splat(vf64, *it), mul(z, acc)) : splat(vf64, *it);
      return acc;
    };
    Value s = add(r, mul(mul(r, z),
                         poly({-1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
                               2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10})));
    Value c = add(sub(splat(vf64, 1.0), mul(splat(vf64, 0.5), z)),
                  mul(mul(z, z), poly({4.16666666666666019037e-02, -1.38888888888741095749e-03,
                                       2.48015872894767294178e-05, -2.75573143513906633035e-07,
                                       2.08757232129817482790e-09, -1.13596475577881948265e-11})));
    // Quadrant q = k mod 4: odd swaps sin and cos; sin < 0 for q in {2, 3}, cos < 0
    // for q in {1, 2}.
    Value q = b.create<mlir::arith::FPToSIOp>(loc, vi32, k);
    auto bit = [&](Value v, int64_t m) {
      Value andv = b.create<mlir::arith::AndIOp>(loc, v, splatInt(vi32, m));
      return b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::ne, andv, splatInt(vi32, 0));
    };
    Value swap = bit(q, 1);
    Value sinNeg = bit(q, 2);
    Value cosNeg = bit(b.create<mlir::arith::AddIOp>(loc, q, splatInt(vi32, 1)), 2);
    Value sv = b.create<mlir::arith::SelectOp>(loc, swap, c, s);
    Value cv = b.create<mlir::arith::SelectOp>(loc, swap, s, c);
    sv = b.create<mlir::arith::SelectOp>(loc, sinNeg, b.create<mlir::arith::NegFOp>(loc, sv), sv);
    cv = b.create<mlir::arith::SelectOp>(loc, cosNeg, b.create<mlir::arith::NegFOp>(loc, cv), cv);
    return {b.create<mlir::arith::TruncFOp>(loc, vf32, sv), b.create<mlir::arith::TruncFOp>(loc, vf32, cv)};
  }
};

// A new public kernel function (params, begin, end[, scratch]) -> () in `kernels`.
mlir::func::FuncOp newKernel(mlir::ModuleOp kernels, llvm::StringRef name, mlir::Location loc,
                             bool scratch = false) {
  mlir::OpBuilder b(kernels.getBodyRegion());
  b.setInsertionPointToEnd(kernels.getBody());
  auto ptr = mlir::LLVM::LLVMPointerType::get(b.getContext());
  llvm::SmallVector<mlir::Type> args = {ptr, b.getI64Type(), b.getI64Type()};
  if (scratch)
    args.push_back(ptr);
  auto fn = b.create<mlir::func::FuncOp>(loc, name, b.getFunctionType(args, {}));
  fn.addEntryBlock();
  return fn;
}

// RoPE (kiln_uk_rope_params_t, rows [begin, end)) for `heads` heads of `headDim`:
//   for t: pos = positions[t]
//     for i0 in 0..half step V: (s, c) = sincos(pos * inv_freq[i0 .. i0+V))
//       for h: x1 = x[t, h*d + i0..], x2 = x[t, h*d + half + i0..]
//              y[.. i0] = x1*c - x2*s, y[.. half + i0] = x2*c + x1*s
// Angles are computed once per row and lane block and shared by the heads, as in
// the reference; the output may alias the input (every element is read before it
// is written).
void buildRope(mlir::ModuleOp kernels, llvm::StringRef name, int64_t heads, int64_t headDim, int64_t maxLanes,
               mlir::Location loc) {
  mlir::func::FuncOp fn = newKernel(kernels, name, loc);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  const int64_t half = headDim / 2;
  int64_t lanes = 1;
  while (lanes * 2 <= maxLanes && half % (lanes * 2) == 0)
    lanes *= 2;
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  Value params = fn.getArgument(0);
  Value x = f.field(params, offsetof(kiln_uk_rope_params_t, x), f.ptr);
  Value y = f.field(params, offsetof(kiln_uk_rope_params_t, y), f.ptr);
  Value ld = f.field(params, offsetof(kiln_uk_rope_params_t, ld), f.i64);
  Value positions = f.field(params, offsetof(kiln_uk_rope_params_t, positions), f.ptr);
  Value invFreq = f.field(params, offsetof(kiln_uk_rope_params_t, inv_freq), f.ptr);
  f.loop(fn.getArgument(1), fn.getArgument(2), f.cI64(1), [&](Value t) {
    Value row = f.muli(t, ld);
    Value xRow = f.gep(x, f.f32, row);
    Value yRow = f.gep(y, f.f32, row);
    Value pos = b.create<mlir::arith::SIToFPOp>(loc, f.f32, f.load(f.i32, positions, f.i32, t));
    Value posV = b.create<mlir::vector::BroadcastOp>(loc, vf32, pos);
    f.loop(f.cI64(0), f.cI64(half), f.cI64(lanes), [&](Value i0) {
      Value angle = f.mul(posV, f.load(vf32, invFreq, f.f32, i0));
      std::pair<Value, Value> sc = f.sinCos(angle, lanes);
      Value s = sc.first, c = sc.second;
      f.loop(f.cI64(0), f.cI64(heads * headDim), f.cI64(headDim), [&](Value hd) {
        Value lo = f.addi(hd, i0);
        Value hi = f.addi(lo, f.cI64(half));
        Value x1 = f.load(vf32, xRow, f.f32, lo);
        Value x2 = f.load(vf32, xRow, f.f32, hi);
        f.store(f.sub(f.mul(x1, c), f.mul(x2, s)), yRow, f.f32, lo);
        f.store(f.add(f.mul(x2, c), f.mul(x1, s)), yRow, f.f32, hi);
      });
    });
  });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}


// Whether the target converts f16 to f32 in registers (x86 needs F16C; every
// AArch64 CPU has FCVTL). Without it LLVM would call a library routine.
bool hasF16Conversion(const Target& target) {
  return target.arch == TargetArch::AArch64 || (target.features & format::kCpuX86F16c);
}

// The float encodings a generated matmul decodes in registers on `target`.
uint32_t generatedMatmulEncodings(const Target& target) {
  uint32_t e = format::EncodingBit(format::kEncF32) | format::EncodingBit(format::kEncBF16);
  if (hasF16Conversion(target))
    e |= format::EncodingBit(format::kEncF16);
  return e;
}

const char* encodingTag(uint8_t enc) {
  switch (enc) {
  case format::kEncF32: return "f32";
  case format::kEncF16: return "f16";
  default: return "bf16";
  }
}

// y[m, n] = x[m, :] . W[n, :] (+ bias[n]) for float weights of one encoding
// (kiln_uk_matmul_params_t, output channels [begin, end)): 4 x 4 tiles of dot
// products (rows m of x by rows n of W), `lanes`-wide partial sums reduced at the
// end, K's tail by one masked load; M and N tails by 1 x 4 and 1 x 1 tiles. Weights
// are widened in registers (f16: hardware conversion; bf16: a 16-bit shift). The
// multiply-adds may fuse (contract); sums are reassociated within a tile.
void buildMatmulFloat(mlir::ModuleOp kernels, llvm::StringRef name, uint8_t encoding, int64_t lanes,
                      bool isPublic, mlir::Location loc) {
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true);
  if (!isPublic)
    fn.setPrivate();
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  auto vi1 = mlir::VectorType::get({lanes}, b.getI1Type());
  const mlir::Type welem = encoding == format::kEncF32 ? f.f32 : b.getI16Type();
  auto vw = mlir::VectorType::get({lanes}, welem);
  auto fm = mlir::arith::FastMathFlags::contract | mlir::arith::FastMathFlags::reassoc;

  Value params = fn.getArgument(0);
  Value x = f.field(params, offsetof(kiln_uk_matmul_params_t, x), f.ptr);
  Value ldx = f.field(params, offsetof(kiln_uk_matmul_params_t, ldx), f.i64);
  Value M = f.field(params, offsetof(kiln_uk_matmul_params_t, M), f.i64);
  Value K = f.field(params, offsetof(kiln_uk_matmul_params_t, K), f.i64);
  Value w = f.field(params, offsetof(kiln_uk_matmul_params_t, w) + offsetof(kiln_uk_weight_t, data), f.ptr);
  Value biasW = f.field(params, offsetof(kiln_uk_matmul_params_t, bias), f.ptr);
  Value y = f.field(params, offsetof(kiln_uk_matmul_params_t, y), f.ptr);
  Value ldy = f.field(params, offsetof(kiln_uk_matmul_params_t, ldy), f.i64);
  Value nBegin = fn.getArgument(1), nEnd = fn.getArgument(2);
  Value zero = f.cI64(0), one = f.cI64(1), four = f.cI64(4), vl = f.cI64(lanes);
  Value kMain = b.create<mlir::arith::SubIOp>(loc, K, b.create<mlir::arith::RemSIOp>(loc, K, vl));
  Value kTail = b.create<mlir::arith::SubIOp>(loc, K, kMain);
  Value nullPtr = b.create<mlir::LLVM::ZeroOp>(loc, f.ptr);
  Value hasBias = b.create<mlir::LLVM::ICmpOp>(loc, mlir::LLVM::ICmpPredicate::ne, biasW, nullPtr);

  // `lanes` weights of row base[k..] widened to f32 (masked: lanes beyond `count` are 0).
  auto widen = [&](Value raw) -> Value {
    if (encoding == format::kEncF32)
      return raw;
    if (encoding == format::kEncF16) {
      Value half = b.create<mlir::arith::BitcastOp>(loc, mlir::VectorType::get({lanes}, b.getF16Type()), raw);
      return b.create<mlir::arith::ExtFOp>(loc, vf32, half);
    }
    auto vi32 = mlir::VectorType::get({lanes}, f.i32);
    Value wide = b.create<mlir::arith::ExtUIOp>(loc, vi32, raw);
    return b.create<mlir::arith::BitcastOp>(loc, vf32,
                                            b.create<mlir::arith::ShLIOp>(loc, wide, f.splatInt(vi32, 16)));
  };
  auto loadW = [&](Value row, Value k, Value mask) -> Value {
    Value at = f.gep(w, welem, f.addi(f.muli(row, K), k));
    if (!mask)
      return widen(b.create<mlir::LLVM::LoadOp>(loc, vw, at, 2));
    Value pass = b.create<mlir::arith::ConstantOp>(loc, b.getZeroAttr(vw));
    return widen(b.create<mlir::LLVM::MaskedLoadOp>(loc, vw, at, mask, mlir::ValueRange{pass}, 2));
  };
  auto loadX = [&](Value row, Value k, Value mask) -> Value {
    Value at = f.gep(x, f.f32, f.addi(f.muli(row, ldx), k));
    if (!mask)
      return b.create<mlir::LLVM::LoadOp>(loc, vf32, at, 4);
    Value pass = f.splat(vf32, 0.0);
    return b.create<mlir::LLVM::MaskedLoadOp>(loc, vf32, at, mask, mlir::ValueRange{pass}, 4);
  };
  auto fma = [&](Value a, Value c, Value acc) {
    return b.create<mlir::arith::AddFOp>(loc, b.create<mlir::arith::MulFOp>(loc, a, c, fm), acc, fm);
  };
  // The bias of output channel n (f32; 0 without one).
  auto bias = [&](Value n) -> Value {
    auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{f.f32}, hasBias, true, true);
    {
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(ifOp.thenBlock());
      Value data = f.field(biasW, offsetof(kiln_uk_weight_t, data), f.ptr);
      b.create<mlir::scf::YieldOp>(loc, f.load(f.f32, data, f.f32, n));
      b.setInsertionPointToStart(ifOp.elseBlock());
      b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{b.create<mlir::arith::ConstantOp>(loc, b.getF32FloatAttr(0))});
    }
    return ifOp.getResult(0);
  };

  // One mr x nr tile at (m0, n0): dot products over K, then y = sum + bias.
  auto tile = [&](Value m0, int64_t mr, Value n0, int64_t nr) {
    const int64_t count = mr * nr;
    llvm::SmallVector<Value> init(count, f.splat(vf32, 0.0));
    auto step = [&](Value k, mlir::ValueRange acc, Value mask) {
      llvm::SmallVector<Value> xs, ws, out;
      for (int64_t i = 0; i < mr; ++i)
        xs.push_back(loadX(f.addi(m0, f.cI64(i)), k, mask));
      for (int64_t r = 0; r < nr; ++r)
        ws.push_back(loadW(f.addi(n0, f.cI64(r)), k, mask));
      for (int64_t i = 0; i < mr; ++i)
        for (int64_t r = 0; r < nr; ++r)
          out.push_back(fma(xs[i], ws[r], acc[i * nr + r]));
      return out;
    };
    auto loop = b.create<mlir::scf::ForOp>(loc, zero, kMain, vl, init);
    {
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(loop.getBody());
      b.create<mlir::scf::YieldOp>(loc, step(loop.getInductionVar(), loop.getRegionIterArgs(), nullptr));
    }
    // The tail of K, masked.
    Value any = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sgt, kTail, zero);
    llvm::SmallVector<mlir::Type> types(count, vf32);
    auto tail = b.create<mlir::scf::IfOp>(loc, types, any, true, true);
    {
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(tail.thenBlock());
      Value mask = b.create<mlir::vector::CreateMaskOp>(
          loc, vi1, mlir::ValueRange{b.create<mlir::arith::IndexCastOp>(loc, b.getIndexType(), kTail)});
      b.create<mlir::scf::YieldOp>(loc, step(kMain, loop.getResults(), mask));
      b.setInsertionPointToStart(tail.elseBlock());
      b.create<mlir::scf::YieldOp>(loc, loop.getResults());
    }
    for (int64_t i = 0; i < mr; ++i)
      for (int64_t r = 0; r < nr; ++r) {
        Value n = f.addi(n0, f.cI64(r));
        Value sum = b.create<mlir::vector::ReductionOp>(loc, mlir::vector::CombiningKind::ADD,
                                                        tail.getResult(i * nr + r), Value(), fm);
        f.store(f.add(sum, bias(n)), y, f.f32, f.addi(f.muli(f.addi(m0, f.cI64(i)), ldy), n));
      }
  };

  auto roundDown = [&](Value v, Value lo, Value m) {  // lo + (v - lo) / m * m
    Value span = b.create<mlir::arith::SubIOp>(loc, v, lo);
    return f.addi(lo, f.muli(b.create<mlir::arith::DivSIOp>(loc, span, m), m));
  };
  Value nMain = roundDown(nEnd, nBegin, four);
  Value mMain = roundDown(M, zero, four);
  f.loop(nBegin, nMain, four, [&](Value n0) {
    f.loop(zero, mMain, four, [&](Value m0) { tile(m0, 4, n0, 4); });
    f.loop(mMain, M, one, [&](Value m0) { tile(m0, 1, n0, 4); });
  });
  f.loop(nMain, nEnd, one, [&](Value n0) { f.loop(zero, M, one, [&](Value m0) { tile(m0, 1, n0, 1); }); });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// The matmul family of an op whose weights have the encodings `encodings` (a
// kiln_uk_matmul_fn): one function per encoding, and with several a public
// dispatcher on the weight's encoding.
void buildMatmul(mlir::ModuleOp kernels, llvm::StringRef name, uint32_t encodings, int64_t lanes,
                 mlir::Location loc) {
  llvm::SmallVector<uint8_t> encs;
  for (uint8_t e : {format::kEncF32, format::kEncF16, format::kEncBF16})
    if (encodings & format::EncodingBit(e))
      encs.push_back(e);
  if (encs.size() == 1) {
    buildMatmulFloat(kernels, name, encs[0], lanes, true, loc);
    return;
  }
  for (uint8_t e : encs)
    buildMatmulFloat(kernels, (name + "_w" + encodingTag(e)).str(), e, lanes, false, loc);
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  Value enc = f.field(fn.getArgument(0), offsetof(kiln_uk_matmul_params_t, w) + offsetof(kiln_uk_weight_t, encoding),
                      b.getI8Type());
  for (uint8_t e : encs) {
    Value is = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, enc,
                                             b.create<mlir::arith::ConstantIntOp>(loc, e, 8));
    auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, is, false);
    mlir::OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    b.create<mlir::func::CallOp>(loc, (name + "_w" + encodingTag(e)).str(), mlir::TypeRange{},
                                 fn.getArguments());
  }
  b.create<mlir::func::ReturnOp>(loc);
}

} // namespace

bool canGenerate(const Target& target) { return target.generate; }

namespace {

bool isMatmulOp(mlir::Operation* op) {
  return llvm::isa<LinearOp, LmHeadOp, GatedMlpOp, MoeOp, PatchEmbedOp>(op);
}

// The storage encodings of an op's weights, in operand order (the last of a
// Linear's or PatchEmbed's two is the bias).
llvm::SmallVector<uint8_t> weightEncodings(mlir::Operation* op) {
  llvm::SmallVector<uint8_t> out;
  auto module = op->getParentOfType<mlir::ModuleOp>();
  for (mlir::Value operand : op->getOperands()) {
    auto ref = operand.getDefiningOp<WeightRefOp>();
    if (!ref)
      continue;
    auto weight = mlir::SymbolTable::lookupSymbolIn(module, ref.getNameAttr());
    if (auto w = llvm::dyn_cast_or_null<WeightOp>(weight))
      out.push_back(encodingSpec(w.getEncoding()).id);
  }
  return out;
}

} // namespace

bool generatorSupports(mlir::Operation* op, llvm::StringRef kernelName, const Target& target, std::string* why) {
  if (!canGenerate(target)) {
    *why = "the portable target generates no code";
    return false;
  }
  if (llvm::isa<RopeOp>(op))
    return true;
  if (isMatmulOp(op)) {
    llvm::SmallVector<uint8_t> encs = weightEncodings(op);
    const bool hasBias = llvm::isa<LinearOp, PatchEmbedOp>(op) && encs.size() == 2;
    const uint32_t ok = generatedMatmulEncodings(target);
    for (size_t i = 0; i < encs.size(); ++i) {
      if (hasBias && i + 1 == encs.size() ? encs[i] != format::kEncF32 : !(ok & format::EncodingBit(encs[i]))) {
        *why = std::string("no generated matmul for ") + (hasBias && i + 1 == encs.size() ? "a bias in " : "") +
               (format::EncodingName(encs[i]) ? format::EncodingName(encs[i]) : "this encoding") + " on " +
               target.triple;
        return false;
      }
    }
    return true;
  }
  *why = "no generator for " + op->getName().getStringRef().str() + " (" + kernelName.str() + ")";
  return false;
}

mlir::OwningOpRef<mlir::ModuleOp> buildKernelModule(mlir::ModuleOp model, const Target& target) {
  mlir::MLIRContext* ctx = model.getContext();
  ctx->loadDialect<mlir::arith::ArithDialect, mlir::func::FuncDialect, mlir::LLVM::LLVMDialect,
                   mlir::scf::SCFDialect, mlir::vector::VectorDialect, mlir::cf::ControlFlowDialect>();
  mlir::OpBuilder top(ctx);
  mlir::OwningOpRef<mlir::ModuleOp> kernels = mlir::ModuleOp::create(model.getLoc(), llvm::StringRef("kiln_kernels"));
  setModuleTarget(*kernels, target);
  const std::string isa = isaSuffix(target);
  const int64_t lanes = vectorLanes(target);
  std::map<std::string, bool> built;
  bool failed = false;
  model.walk([&](mlir::Operation* op) {
    auto kernelName = op->getAttrOfType<mlir::StringAttr>("kiln.kernel");
    if (!kernelName)
      return;
    const format::KernelInfo* info = kernelByName(kernelName.getValue());
    if (!info || llvm::StringRef(info->isa) != "generated")
      return;
    if (!canGenerate(target)) {
      op->emitOpError("is bound to generated kernel ") << info->name << " but target " << target.triple
                                                       << " generates no code";
      failed = true;
      return;
    }
    std::string symbol;
    if (auto rope = llvm::dyn_cast<RopeOp>(op)) {
      int64_t heads = rope.getNumHeads(), hd = rope.getHeadDim();
      if (hd <= 0 || hd % 2 != 0 || heads <= 0) {
        op->emitOpError("cannot generate a rope kernel for head_dim ") << hd << " and " << heads << " heads";
        failed = true;
        return;
      }
      symbol = "kiln_uk_rope_f32_f32_" + std::to_string(heads) + "x" + std::to_string(hd) + "_gen_" + isa;
      if (!built[symbol])
        buildRope(*kernels, symbol, heads, hd, lanes, op->getLoc());
    } else if (isMatmulOp(op)) {
      std::string why;
      if (!generatorSupports(op, info->name, target, &why)) {
        op->emitOpError("cannot generate kernel ") << info->name << ": " << why;
        failed = true;
        return;
      }
      uint32_t encodings = 0;
      llvm::SmallVector<uint8_t> encs = weightEncodings(op);
      for (size_t i = 0; i < encs.size(); ++i)
        if (!(llvm::isa<LinearOp, PatchEmbedOp>(op) && encs.size() == 2 && i == 1))
          encodings |= format::EncodingBit(encs[i]);
      std::string tag;
      for (uint8_t e : {format::kEncF32, format::kEncF16, format::kEncBF16})
        if (encodings & format::EncodingBit(e))
          tag += std::string(tag.empty() ? "" : "_") + encodingTag(e);
      symbol = "kiln_uk_matmul_bias_f32_f32_w" + tag + "_4x4_gen_" + isa;
      if (!built[symbol])
        buildMatmul(*kernels, symbol, encodings, lanes, op->getLoc());
    } else {
      op->emitOpError("has no kernel generator for ") << op->getName() << " (kernel " << info->name << ")";
      failed = true;
      return;
    }
    built[symbol] = true;
    op->setAttr(kSymbolAttrName, top.getStringAttr(symbol));
  });
  if (failed)
    return nullptr;
  // Fold and share the constants the builders repeat.
  mlir::PassManager pm(ctx);
  pm.addPass(mlir::createCanonicalizerPass());
  pm.addPass(mlir::createCSEPass());
  if (mlir::failed(pm.run(*kernels))) {
    model.emitError("kernel generator: canonicalising the kernels failed");
    return nullptr;
  }
  return kernels;
}

namespace {

// The kiln_kernel_library_t `name` listing every public function of `module`:
//   { u32 struct_size, u32 count, u64 hash, const char* const* names,
//     void (*const* functions)(void) }  (32 bytes on LP64 targets).
void addLibraryTable(llvm::Module& module, llvm::StringRef name, uint64_t hash) {
  llvm::LLVMContext& ctx = module.getContext();
  llvm::Type* i32 = llvm::Type::getInt32Ty(ctx);
  llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
  llvm::PointerType* ptr = llvm::PointerType::get(ctx, 0);
  std::vector<llvm::Constant*> names, functions;
  for (llvm::Function& fn : module) {
    if (fn.isDeclaration() || !fn.hasExternalLinkage())
      continue;
    llvm::Constant* str = llvm::ConstantDataArray::getString(ctx, fn.getName());
    auto* gv = new llvm::GlobalVariable(module, str->getType(), true, llvm::GlobalValue::PrivateLinkage, str,
                                        name + ".name");
    names.push_back(gv);
    functions.push_back(&fn);
  }
  auto array = [&](std::vector<llvm::Constant*>& elems, const char* suffix) {
    auto* type = llvm::ArrayType::get(ptr, elems.size());
    return new llvm::GlobalVariable(module, type, true, llvm::GlobalValue::PrivateLinkage,
                                    llvm::ConstantArray::get(type, elems), name + suffix);
  };
  llvm::GlobalVariable* nameArray = array(names, ".names");
  llvm::GlobalVariable* fnArray = array(functions, ".functions");
  // Only the table is exported: the libraries of several artifacts link into one app.
  for (llvm::Constant* fn : functions)
    llvm::cast<llvm::Function>(fn)->setLinkage(llvm::GlobalValue::InternalLinkage);
  auto* type = llvm::StructType::get(ctx, {i32, i32, i64, ptr, ptr});
  llvm::Constant* init = llvm::ConstantStruct::get(
      type, {llvm::ConstantInt::get(i32, 32), llvm::ConstantInt::get(i32, names.size()),
             llvm::ConstantInt::get(i64, hash), nameArray, fnArray});
  new llvm::GlobalVariable(module, type, true, llvm::GlobalValue::ExternalLinkage, init, name);
}

} // namespace

mlir::LogicalResult compileKernels(mlir::ModuleOp kernels, const Target& target, GeneratedCode* out,
                                   llvm::raw_ostream* llvmIr, llvm::raw_ostream* assembly,
                                   const KernelObjectOptions& packaging) {
  mlir::MLIRContext* ctx = kernels.getContext();
  auto fail = [&](const llvm::Twine& why) {
    return kernels.emitError("kernel generator (") << target.triple << "): " << why.str();
  };
  // MLIR: scf/arith/vector/func on LLVM pointers -> the LLVM dialect.
  mlir::PassManager pm(ctx);
  pm.addPass(mlir::createConvertSCFToCFPass());
  pm.addPass(mlir::createConvertVectorToLLVMPass());
  pm.addPass(mlir::createArithToLLVMConversionPass());
  pm.addPass(mlir::createConvertControlFlowToLLVMPass());
  pm.addPass(mlir::createConvertFuncToLLVMPass());
  pm.addPass(mlir::createReconcileUnrealizedCastsPass());
  if (mlir::failed(pm.run(kernels)))
    return fail("lowering to the LLVM dialect failed");
  // Kernels never unwind: no .eh_frame to relocate at load.
  mlir::OpBuilder b(ctx);
  kernels.walk([&](mlir::LLVM::LLVMFuncOp fn) {
    fn->setAttr("passthrough", b.getArrayAttr({b.getStringAttr("nounwind")}));
  });

  // LLVM IR for the target machine.
  initLLVMTargets();
  std::string error;
  const llvm::Target* llvmTarget = llvm::TargetRegistry::lookupTarget(target.triple, error);
  if (!llvmTarget)
    return fail("LLVM has no backend: " + error);
  llvm::TargetOptions options;
  std::unique_ptr<llvm::TargetMachine> tm(llvmTarget->createTargetMachine(
      target.triple, "generic", llvmFeatures(target), options, llvm::Reloc::PIC_, llvm::CodeModel::Small,
      llvm::CodeGenOptLevel::Aggressive));
  if (!tm)
    return fail("cannot create a target machine");
  mlir::registerBuiltinDialectTranslation(*ctx);
  mlir::registerLLVMDialectTranslation(*ctx);
  llvm::LLVMContext llvmContext;
  std::unique_ptr<llvm::Module> module = mlir::translateModuleToLLVMIR(kernels, llvmContext, "kiln_kernels");
  if (!module)
    return fail("translation to LLVM IR failed");
  module->setTargetTriple(target.triple);
  module->setDataLayout(tm->createDataLayout());
  if (!packaging.tableSymbol.empty())
    addLibraryTable(*module, packaging.tableSymbol, packaging.hash);
  if (llvm::verifyModule(*module, &llvm::errs()))
    return fail("the generated LLVM IR does not verify");

  // Optimise (loop unrolling, scheduling; the vector code is explicit already).
  {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder pb(tm.get());
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2).run(*module, mam);
  }
  if (llvmIr)
    module->print(*llvmIr, nullptr);
  out->symbols.clear();
  for (const llvm::Function& fn : *module)
    if (!fn.isDeclaration() && fn.hasExternalLinkage())
      out->symbols.push_back(fn.getName().str());

  auto emitFile = [&](llvm::CodeGenFileType type, llvm::SmallVectorImpl<char>& bytes) {
    llvm::raw_svector_ostream os(bytes);
    llvm::legacy::PassManager codegen;
    if (tm->addPassesToEmitFile(codegen, os, nullptr, type))
      return false;
    codegen.run(*module);
    return true;
  };
  if (assembly) {
    llvm::SmallVector<char, 0> text;
    if (!emitFile(llvm::CodeGenFileType::AssemblyFile, text))
      return fail("the target cannot emit assembly");
    assembly->write(text.data(), text.size());
  }
  llvm::SmallVector<char, 0> object;
  if (!emitFile(llvm::CodeGenFileType::ObjectFile, object))
    return fail("the target cannot emit objects");

  // The object must stand alone: the runtime's loader resolves nothing outside it.
  auto parsed = llvm::object::ObjectFile::createObjectFile(
      llvm::MemoryBufferRef(llvm::StringRef(object.data(), object.size()), "kernels"));
  if (!parsed)
    return fail("cannot read back the object: " + llvm::toString(parsed.takeError()));
  for (const llvm::object::SymbolRef& sym : (*parsed)->symbols()) {
    auto flags = sym.getFlags();
    auto name = sym.getName();
    if (!flags || !name)
      return fail("unreadable symbol in the object");
    if ((*flags & llvm::object::SymbolRef::SF_Undefined) && !name->empty())
      return fail("the kernels call '" + *name + "', which is outside the code segment");
  }
  if (!packaging.library && !(*parsed)->isELF())
    return fail("the target does not produce ELF objects");
  for (const llvm::object::SectionRef& sec : (*parsed)->sections()) {
    if (!(*parsed)->isELF())
      break;
    llvm::object::ELFSectionRef elf(sec);
    if (!packaging.library && (elf.getFlags() & llvm::ELF::SHF_ALLOC) && (elf.getFlags() & llvm::ELF::SHF_WRITE)) {
      llvm::Expected<llvm::StringRef> name = sec.getName();
      std::string secName = name ? name->str() : llvm::toString(name.takeError());
      return fail("the kernels have writable data (section " + secName + ")");
    }
  }
  out->object.assign(object.begin(), object.end());
  out->machine = target.arch == TargetArch::X86_64 ? llvm::ELF::EM_X86_64 : llvm::ELF::EM_AARCH64;
  out->cpuFeatures = target.features;
  out->triple = target.triple;
  return mlir::success();
}

} // namespace kiln
