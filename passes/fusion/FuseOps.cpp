//===- FuseOps.cpp - operator fusion (kiln-fuse-*) ---------------*- C++ -*-===//
//
// Passes that fold the ops of a transformer layer into fewer kernels, each
// reporting every fusion it makes or refuses as a remark on the op:
//   kiln-fuse-qkv       Q/K/V projections of one input -> one kiln.linear over a
//                       concatenated weight, and the attention with its two ropes ->
//                       one kiln.qkv_attention;
//   kiln-fuse-rope      the rope and KV-cache write of a kiln.qkv_attention -> the
//                       epilogue of the q|k|v kiln.linear;
//   kiln-fuse-gate-up   a gated MLP's gate and up -> one weight of their rows
//                       interleaved, one product with an act(gate) * up epilogue;
//   kiln-fuse-norm      an RMSNorm/LayerNorm read by one matmul -> that matmul's
//                       prologue;
//   kiln-fuse-activation kiln.activation(linear(x)) -> the linear's epilogue;
//   kiln-fuse-residual  kiln.add(r, matmul(x)) -> the matmul's residual epilogue;
//                       a position embedding of a patch embedding (and CLIP's class
//                       token between them) -> its epilogue.
// A fused op keeps the name of the layer it came from (the Q projection's becomes
// `...qkv_proj`) and lists the layers folded into it in `kiln.fused`.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/KilnOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "passes/Passes.h"
#include "passes/Weights.h"

namespace kiln {
#define GEN_PASS_DEF_KILNFUSEQKV
#define GEN_PASS_DEF_KILNFUSEROPE
#define GEN_PASS_DEF_KILNFUSEGATEUP
#define GEN_PASS_DEF_KILNFUSENORM
#define GEN_PASS_DEF_KILNFUSERESIDUAL
#define GEN_PASS_DEF_KILNFUSEACTIVATION
#include "passes/Passes.h.inc"

namespace {

constexpr const char* kFusedAttr = "kiln.fused";

std::string nameOf(mlir::Operation* op) {
  if (auto nl = llvm::dyn_cast<mlir::NameLoc>(op->getLoc()))
    return nl.getName().str();
  return op->getName().getStringRef().str();
}

// `kiln.fused` of an op replacing `parts`: every op of the unfused model it computes
// (a part's own list when it was fused before, else its name). Set when more than one.
void recordFused(mlir::Operation* into, llvm::ArrayRef<mlir::Operation*> parts) {
  llvm::SmallVector<mlir::Attribute> names;
  mlir::Builder b(into->getContext());
  for (mlir::Operation* op : parts) {
    if (auto a = op->getAttrOfType<mlir::ArrayAttr>(kFusedAttr))
      names.append(a.begin(), a.end());
    else
      names.push_back(b.getStringAttr(nameOf(op)));
  }
  if (names.size() > 1)
    into->setAttr(kFusedAttr, b.getArrayAttr(names));
  else
    into->removeAttr(kFusedAttr);
}

// The attributes of `op` to keep on its replacement: the kiln.* ones a pass added.
void copyKilnAttrs(mlir::Operation* from, mlir::Operation* to) {
  for (mlir::NamedAttribute a : from->getAttrs())
    if (a.getName().getValue().starts_with("kiln.") && a.getName().getValue() != kFusedAttr &&
        !to->hasAttr(a.getName()))
      to->setAttr(a.getName(), a.getValue());
}

bool onlyUser(mlir::Value v, mlir::Operation* user) {
  return v.hasOneUse() && *v.getUsers().begin() == user;
}

// `v` is available at `op`: a block argument or defined before it in the block.
bool dominates(mlir::Value v, mlir::Operation* op) {
  mlir::Operation* def = v.getDefiningOp();
  if (!def)
    return true;
  return def->getBlock() == op->getBlock() && def->isBeforeInBlock(op);
}

// A linear's or gated MLP's operands and fusion attributes, to rebuild the op with some
// of them changed (optional operands change the op's operand segments).
struct LinearParts {
  mlir::Value input, weight, bias, residual, positions, normWeight, normBias;
  mlir::StringAttr norm;
  mlir::FloatAttr epsilon;
  ActivationKindAttr activation;
  mlir::DictionaryAttr qkv;
  explicit LinearParts(LinearOp l)
      : input(l.getInput()), weight(l.getWeight()), bias(l.getBias()), residual(l.getResidual()),
        positions(l.getPositions()), normWeight(l.getNormWeight()), normBias(l.getNormBias()), norm(l.getNormAttr()),
        epsilon(l.getNormEpsilonAttr()), activation(l.getActivationAttr()), qkv(l.getQkvAttr()) {}
  LinearOp build(mlir::OpBuilder& b, LinearOp like) const {
    return b.create<LinearOp>(like.getLoc(), like.getType(), input, weight, bias, residual, positions, normWeight,
                              normBias, norm, epsilon, activation, qkv);
  }
};
struct GatedMlpParts {
  mlir::Value input, gate, up, down, residual, normWeight, normBias;
  ActivationKindAttr activation;
  mlir::StringAttr norm;
  mlir::FloatAttr epsilon;
  mlir::IntegerAttr gateUpBlock;
  explicit GatedMlpParts(GatedMlpOp g)
      : input(g.getInput()), gate(g.getGate()), up(g.getUp()), down(g.getDown()), residual(g.getResidual()),
        normWeight(g.getNormWeight()), normBias(g.getNormBias()), activation(g.getActivationAttr()),
        norm(g.getNormAttr()), epsilon(g.getNormEpsilonAttr()), gateUpBlock(g.getGateUpBlockAttr()) {}
  GatedMlpOp build(mlir::OpBuilder& b, GatedMlpOp like) const {
    return b.create<GatedMlpOp>(like.getLoc(), like.getType(), input, gate, up, down, residual, normWeight, normBias,
                                activation, norm, epsilon, gateUpBlock);
  }
};

//===----------------------------------------------------------------------===//
// kiln-fuse-qkv
//===----------------------------------------------------------------------===//

// The weight concatenating `parts` along rows, interleaved in blocks of `block` rows
// when non-zero (made once per module, by name).
WeightOp concatWeight(mlir::ModuleOp module, llvm::StringRef name, llvm::ArrayRef<WeightOp> parts, int64_t block = 0) {
  mlir::SymbolTable symbols(module);
  mlir::MLIRContext* ctx = module.getContext();
  llvm::SmallVector<mlir::Attribute> operands;
  llvm::SmallVector<mlir::Attribute> from;
  int64_t rows = 0;
  for (WeightOp w : parts) {
    operands.push_back(exprOperand(w));
    from.push_back(mlir::FlatSymbolRefAttr::get(w.getSymNameAttr()));
    rows += w.getTensorType().getDimSize(0);
  }
  // The same parts fused for another stage: that weight; a name the checkpoint
  // already uses for something else: another name.
  std::string unique = name.str();
  for (int i = 1;; ++i) {
    WeightOp existing = symbols.lookup<WeightOp>(unique);
    if (!existing)
      break;
    if (existing->getAttr("kiln.fused_from") == mlir::ArrayAttr::get(ctx, from))
      return existing;
    unique = (name + ".fused" + llvm::Twine(i)).str();
  }
  WeightOp first = parts[0];
  mlir::RankedTensorType t0 = first.getTensorType();
  llvm::SmallVector<int64_t> shape(t0.getShape());
  shape[0] = rows;
  mlir::OpBuilder b(ctx);
  b.setInsertionPoint(first);
  auto w = b.create<WeightOp>(first.getLoc(), b.getStringAttr(unique),
                              mlir::TypeAttr::get(mlir::RankedTensorType::get(shape, t0.getElementType())),
                              llvm::cast<WeightExprAttrInterface>(ConcatAttr::get(ctx, 0, operands, block)),
                              first.getEncoding());
  w->setAttr("kiln.fused_from", b.getArrayAttr(from));
  return w;
}

struct FuseQkvPass : impl::KilnFuseQkvBase<FuseQkvPass> {
  // Why q, k and v (with their ropes) cannot be fused, or "" when they can.
  std::string refusal(AttentionOp att, LinearOp q, LinearOp k, LinearOp v, RopeOp rq, RopeOp rk) {
    if (!q || !k || !v)
      return "q, k and v are not all projections (kiln.linear) of the attention";
    if (q.getInput() != k.getInput() || q.getInput() != v.getInput())
      return "q, k and v project different inputs";
    for (LinearOp l : {q, k, v})
      if (l.getResidual() || l.getNormWeight() || l.getActivation())
        return nameOf(l) + " is already fused";
    if (static_cast<bool>(q.getBias()) != static_cast<bool>(k.getBias()) ||
        static_cast<bool>(q.getBias()) != static_cast<bool>(v.getBias()))
      return "some of q, k, v have a bias and some do not";
    if (static_cast<bool>(rq) != static_cast<bool>(rk))
      return "only one of q and k is rotated";
    WeightOp wq = weightOf(q.getWeight()), wk = weightOf(k.getWeight()), wv = weightOf(v.getWeight());
    if (!wq || !wk || !wv)
      return "a projection's weight is not a kiln.weight";
    if (wq.getEncoding() != wk.getEncoding() || wq.getEncoding() != wv.getEncoding())
      return ("their weights were assigned different encodings (q " + wq.getEncoding().getLabel() + ", k " +
              wk.getEncoding().getLabel() + ", v " + wv.getEncoding().getLabel() +
              "); kept apart to honour the precision assignment");
    if (wq.getTensorType().getElementType() != wk.getTensorType().getElementType() ||
        wq.getTensorType().getElementType() != wv.getTensorType().getElementType())
      return "their weights have different element types";
    if (q.getBias()) {
      WeightOp bq = weightOf(q.getBias()), bk = weightOf(k.getBias()), bv = weightOf(v.getBias());
      if (!bq || !bk || !bv || bq.getEncoding() != bk.getEncoding() || bq.getEncoding() != bv.getEncoding() ||
          bq.getTensorType().getElementType() != bk.getTensorType().getElementType() ||
          bq.getTensorType().getElementType() != bv.getTensorType().getElementType())
        return "their biases differ in encoding or element type";
    }
    mlir::Value results[] = {rq ? rq.getResult() : q.getResult(), rk ? rk.getResult() : k.getResult(),
                             v.getResult()};
    for (mlir::Value r : results)
      if (!onlyUser(r, att))
        return "a projection is read by other ops than the attention";
    if (rq && (!onlyUser(q.getResult(), rq) || !onlyUser(k.getResult(), rk)))
      return "a projection is read by other ops than its rope";
    if (q.getResult() == k.getResult() || k.getResult() == v.getResult() || q.getResult() == v.getResult())
      return "q, k and v are not three projections";
    if (rq) {
      if (rq.getPositions() != rk.getPositions() || (att.getPositions() && rq.getPositions() != att.getPositions()))
        return "q and k are rotated at different positions";
      if (rq.getHeadDim() != att.getHeadDim() || rk.getHeadDim() != att.getHeadDim() ||
          rq.getNumHeads() != att.getNumHeads() || rk.getNumHeads() != att.getNumKvHeads())
        return "the ropes' heads differ from the attention's";
      for (llvm::StringRef a : {"theta", "rope_type", "factor", "low_freq_factor", "high_freq_factor",
                                "original_max_position_embeddings"})
        if (rq->getAttr(a) != rk->getAttr(a))
          return ("q and k are rotated differently (" + a + ")").str();
    }
    return "";
  }

  void runOnOperation() override {
    mlir::ModuleOp module = getOperation();
    llvm::SmallVector<AttentionOp> attentions;
    module.walk([&](AttentionOp a) { attentions.push_back(a); });
    for (AttentionOp att : attentions) {
      RopeOp rq = att.getQuery().getDefiningOp<RopeOp>(), rk = att.getKey().getDefiningOp<RopeOp>();
      auto q = (rq ? rq.getInput() : att.getQuery()).getDefiningOp<LinearOp>();
      auto k = (rk ? rk.getInput() : att.getKey()).getDefiningOp<LinearOp>();
      auto v = att.getValue().getDefiningOp<LinearOp>();
      std::string why = refusal(att, q, k, v, rq, rk);
      if (!why.empty()) {
        att.emitRemark() << "kiln-fuse-qkv: not fused: " << why;
        continue;
      }
      // The fused projection's name: the Q projection's with q_proj -> qkv_proj.
      std::string qName = nameOf(q);
      std::string name = llvm::StringRef(qName).ends_with("q_proj")
                             ? qName.substr(0, qName.size() - 6) + "qkv_proj"
                             : qName + "_qkv";
      // The fused weights are named after the Q projection's (q_proj -> qkv_proj).
      auto fusedName = [](llvm::StringRef qName) {
        size_t at = qName.rfind("q_proj");
        return at == llvm::StringRef::npos ? (qName + ".qkv").str()
                                           : (qName.substr(0, at) + "qkv_proj" + qName.substr(at + 6)).str();
      };
      WeightOp wq = weightOf(q.getWeight()), wk = weightOf(k.getWeight()), wv = weightOf(v.getWeight());
      WeightOp wqkv = concatWeight(module, fusedName(wq.getSymName()), {wq, wk, wv});
      WeightOp bqkv;
      if (q.getBias()) {
        WeightOp bq = weightOf(q.getBias());
        bqkv = concatWeight(module, fusedName(bq.getSymName()), {bq, weightOf(k.getBias()), weightOf(v.getBias())});
      }

      // The first of the three projections in the block is where the fused one runs.
      mlir::Operation* first = q;
      for (mlir::Operation* op : {k.getOperation(), v.getOperation()})
        if (op->isBeforeInBlock(first))
          first = op;
      mlir::OpBuilder b(first);
      auto ref = [&](WeightOp w) {
        return b.create<WeightRefOp>(w.getLoc(), w.getTensorType(), mlir::FlatSymbolRefAttr::get(w.getSymNameAttr()))
            .getResult();
      };
      mlir::Value wRef = ref(wqkv);
      mlir::Value bRef = bqkv ? ref(bqkv) : mlir::Value();
      auto in = llvm::cast<mlir::RankedTensorType>(q.getInput().getType());
      const int64_t width = wqkv.getTensorType().getDimSize(0);
      // Named like the layer, at the Q projection's place in the source.
      mlir::Location where = q.getLoc();
      if (auto nl = llvm::dyn_cast<mlir::NameLoc>(where))
        where = nl.getChildLoc();
      auto linear = b.create<LinearOp>(mlir::NameLoc::get(b.getStringAttr(name), where),
                                       mlir::RankedTensorType::get({in.getDimSize(0), width}, in.getElementType()),
                                       q.getInput(), wRef, bRef);
      recordFused(linear, {q, k, v});

      b.setInsertionPoint(att);
      mlir::DictionaryAttr rope;
      if (rq) {
        llvm::SmallVector<mlir::NamedAttribute> attrs;
        attrs.push_back(b.getNamedAttr("num_heads", b.getI64IntegerAttr(att.getNumHeads() + att.getNumKvHeads())));
        attrs.push_back(b.getNamedAttr("head_dim", b.getI64IntegerAttr(att.getHeadDim())));
        for (llvm::StringRef a : {"theta", "rope_type", "factor", "low_freq_factor", "high_freq_factor",
                                  "original_max_position_embeddings"})
          if (mlir::Attribute v = rq->getAttr(a))
            attrs.push_back(b.getNamedAttr(a, v));
        rope = b.getDictionaryAttr(attrs);
      }
      mlir::Value positions = att.getPositions() ? att.getPositions() : (rq ? rq.getPositions() : mlir::Value());
      auto fused = b.create<QkvAttentionOp>(att.getLoc(), att.getType(), linear.getResult(), positions,
                                            att.getNumHeadsAttr(), att.getNumKvHeadsAttr(), att.getHeadDimAttr(),
                                            att.getScaleAttr(), att.getCausalAttr(), att.getCacheLayerAttr(), rope,
                                            mlir::UnitAttr());
      llvm::SmallVector<mlir::Operation*> folded = {att};
      if (rq)
        folded.append({rq.getOperation(), rk.getOperation()});
      recordFused(fused, folded);
      copyKilnAttrs(att, fused);
      fused.emitRemark() << "kiln-fuse-qkv: " << nameOf(q) << ", " << nameOf(k) << " and " << nameOf(v)
                         << " fused into one " << width << "-wide projection " << name << " ("
                         << wqkv.getEncoding().getLabel() << "), read by the attention"
                         << (rq ? std::string(", which rotates q and k itself (") + nameOf(rq) + ", " + nameOf(rk) + ")"
                                : std::string());
      att.getResult().replaceAllUsesWith(fused.getResult());
      att.erase();
      if (rq) {
        rq.erase();
        rk.erase();
      }
      q.erase();
      k.erase();
      v.erase();
    }
    eraseDeadWeightRefs(module);
    eraseUnreadWeights(module);
  }
};

//===----------------------------------------------------------------------===//
// kiln-fuse-gate-up
//===----------------------------------------------------------------------===//

struct FuseRopePass : impl::KilnFuseRopeBase<FuseRopePass> {
  void runOnOperation() override {
    llvm::SmallVector<QkvAttentionOp> atts;
    getOperation().walk([&](QkvAttentionOp a) { atts.push_back(a); });
    for (QkvAttentionOp att : atts) {
      if (att.getKvWritten() || (!att.getRope() && !att.getCacheLayer()))
        continue;  // done already, or nothing to move (a vision encoder's)
      auto linear = att.getQkv().getDefiningOp<LinearOp>();
      std::string why;
      if (!linear)
        why = "its q|k|v is not a kiln.linear";
      else if (!onlyUser(linear.getResult(), att))
        why = nameOf(linear) + " is also read by other ops";
      else if (linear.getResidual() || linear.getActivation() || linear.getQkv())
        why = nameOf(linear) + " has another epilogue";
      else if (!dominates(att.getPositions(), linear))
        why = "the positions are computed after " + nameOf(linear);
      if (!why.empty()) {
        att.emitRemark() << "kiln-fuse-rope: not fused: " << why;
        continue;
      }
      mlir::OpBuilder b(linear);
      llvm::SmallVector<mlir::NamedAttribute> fields = {
          b.getNamedAttr("num_heads", att.getNumHeadsAttr()), b.getNamedAttr("num_kv_heads", att.getNumKvHeadsAttr()),
          b.getNamedAttr("head_dim", att.getHeadDimAttr())};
      if (att.getCacheLayer())
        fields.push_back(b.getNamedAttr("cache_layer", att.getCacheLayerAttr()));
      if (att.getRope())
        fields.push_back(b.getNamedAttr("rope", att.getRopeAttr()));
      LinearParts parts(linear);
      parts.positions = att.getPositions();
      parts.qkv = b.getDictionaryAttr(fields);
      LinearOp fused = parts.build(b, linear);
      copyKilnAttrs(linear, fused);
      // The rotations' names move with them: kiln-fuse-qkv records the attention's own
      // name first, then its two ropes'; the attention keeps its own only (no list).
      llvm::SmallVector<mlir::Attribute> linearNames;
      if (auto names = linear->getAttrOfType<mlir::ArrayAttr>(kFusedAttr))
        linearNames.append(names.begin(), names.end());
      else
        linearNames.push_back(b.getStringAttr(nameOf(linear)));
      if (auto names = att->getAttrOfType<mlir::ArrayAttr>(kFusedAttr); names && att.getRope() && names.size() == 3) {
        linearNames.append({names[1], names[2]});
        att->removeAttr(kFusedAttr);
      }
      if (linearNames.size() > 1)
        fused->setAttr(kFusedAttr, b.getArrayAttr(linearNames));
      fused.emitRemark() << "kiln-fuse-rope: " << nameOf(att) << "'s "
                         << (att.getRope() ? (att.getCacheLayer() ? "rotation and KV-cache write" : "rotation")
                                           : "KV-cache write")
                         << " fused as the epilogue of " << nameOf(fused);
      linear.getResult().replaceAllUsesWith(fused.getResult());
      linear.erase();
      att.removeRopeAttr();
      att.setKvWritten(true);
    }
  }
};

struct FuseGateUpPass : impl::KilnFuseGateUpBase<FuseGateUpPass> {
  using KilnFuseGateUpBase::KilnFuseGateUpBase;

  // Why gate `wg` and up `wu` cannot be fused, or "" when they can.
  static std::string refusal(WeightOp wg, WeightOp wu) {
    if (!wg || !wu)
      return "the gate or up weight is not a kiln.weight";
    if (wg.getEncoding() != wu.getEncoding())
      return ("their weights were assigned different encodings (gate " + wg.getEncoding().getLabel() + ", up " +
              wu.getEncoding().getLabel() + "); kept apart to honour the precision assignment");
    if (wg.getTensorType().getElementType() != wu.getTensorType().getElementType())
      return "their weights have different element types";
    return "";
  }

  void runOnOperation() override {
    mlir::ModuleOp module = getOperation();
    if (block < 1 || block > 256) {
      module.emitError() << "kiln-fuse-gate-up: block " << static_cast<int64_t>(block) << " must lie in [1, 256]";
      return signalPassFailure();
    }
    llvm::SmallVector<GatedMlpOp> mlps;
    module.walk([&](GatedMlpOp g) {
      if (g.getUp())
        mlps.push_back(g);
    });
    for (GatedMlpOp g : mlps) {
      WeightOp wg = weightOf(g.getGate()), wu = weightOf(g.getUp());
      if (std::string why = refusal(wg, wu); !why.empty()) {
        g.emitRemark() << "kiln-fuse-gate-up: not fused: " << why;
        continue;
      }
      // Named after the gate's weight (gate_proj -> gate_up_proj).
      llvm::StringRef gName = wg.getSymName();
      size_t at = gName.rfind("gate_proj");
      std::string name = at == llvm::StringRef::npos
                             ? (gName + ".gate_up").str()
                             : (gName.substr(0, at) + "gate_up_proj" + gName.substr(at + 9)).str();
      WeightOp wgu = concatWeight(module, name, {wg, wu}, block);
      mlir::OpBuilder b(g);
      GatedMlpParts parts(g);
      parts.gate = b.create<WeightRefOp>(wgu.getLoc(), wgu.getTensorType(),
                                         mlir::FlatSymbolRefAttr::get(wgu.getSymNameAttr()));
      parts.up = mlir::Value();
      parts.gateUpBlock = b.getI64IntegerAttr(block);
      GatedMlpOp fused = parts.build(b, g);
      copyKilnAttrs(g, fused);
      if (auto a = g->getAttr(kFusedAttr))
        fused->setAttr(kFusedAttr, a);
      fused.emitRemark() << "kiln-fuse-gate-up: " << wg.getSymName() << " and " << wu.getSymName()
                         << " fused into one " << wgu.getTensorType().getDimSize(0) << "-row product " << wgu.getSymName()
                         << " (" << wgu.getEncoding().getLabel() << ", rows interleaved in blocks of " << static_cast<int64_t>(block)
                         << "), whose epilogue writes " << stringifyActivationKind(g.getActivation()) << "(gate) * up";
      g.getResult().replaceAllUsesWith(fused.getResult());
      g.erase();
    }
    eraseDeadWeightRefs(module);
    eraseUnreadWeights(module);
  }
};

//===----------------------------------------------------------------------===//
// kiln-fuse-norm
//===----------------------------------------------------------------------===//

struct FuseNormPass : impl::KilnFuseNormBase<FuseNormPass> {
  void runOnOperation() override {
    llvm::SmallVector<mlir::Operation*> norms;
    getOperation().walk([&](mlir::Operation* op) {
      if (llvm::isa<RmsNormOp, LayerNormOp>(op) && op->getParentOfType<mlir::func::FuncOp>())
        norms.push_back(op);
    });
    for (mlir::Operation* norm : norms) {
      mlir::Value out = norm->getResult(0);
      auto users = llvm::to_vector(out.getUsers());
      if (users.size() != 1) {
        norm->emitRemark() << "kiln-fuse-norm: not fused: read by " << users.size()
                           << " ops (a prologue would compute it once per reader)";
        continue;
      }
      mlir::Operation* user = users.front();
      const bool layer = llvm::isa<LayerNormOp>(norm);
      mlir::Value input = norm->getOperand(0), weight = norm->getOperand(1);
      mlir::Value bias = layer ? norm->getOperand(2) : mlir::Value();
      auto epsilon = norm->getAttrOfType<mlir::FloatAttr>("epsilon");
      mlir::OpBuilder b(user);
      mlir::StringAttr kind = b.getStringAttr(layer ? "layer" : "rms");
      mlir::Operation* fused = nullptr;
      // The op with the norm as its prologue.
      auto withNorm = [&](auto parts, auto op) {
        parts.input = input;
        parts.normWeight = weight;
        parts.normBias = bias;
        parts.norm = kind;
        parts.epsilon = epsilon;
        return parts.build(b, op).getOperation();
      };
      if (auto l = llvm::dyn_cast<LinearOp>(user); l && l.getInput() == out && !l.getNormWeight() &&
                                                    l.getResidual() != out) {
        fused = withNorm(LinearParts(l), l);
      } else if (auto g = llvm::dyn_cast<GatedMlpOp>(user); g && g.getInput() == out && !g.getNormWeight() &&
                                                            g.getResidual() != out) {
        fused = withNorm(GatedMlpParts(g), g);
      } else if (llvm::isa<mlir::func::ReturnOp>(user)) {
        norm->emitRemark() << "kiln-fuse-norm: not fused: its result is the output of stage "
                           << norm->getParentOfType<mlir::func::FuncOp>().getSymName();
        continue;
      } else {
        norm->emitRemark() << "kiln-fuse-norm: not fused: its reader " << nameOf(user) << " ("
                           << user->getName() << ") takes no norm prologue";
        continue;
      }
      copyKilnAttrs(user, fused);
      recordFused(fused, {norm, user});
      fused->emitRemark() << "kiln-fuse-norm: " << nameOf(norm) << " (" << (layer ? "LayerNorm" : "RMSNorm")
                          << ") fused as the prologue of " << nameOf(user);
      user->getResult(0).replaceAllUsesWith(fused->getResult(0));
      user->erase();
      norm->erase();
    }
  }
};

//===----------------------------------------------------------------------===//
// kiln-fuse-activation
//===----------------------------------------------------------------------===//

struct FuseActivationPass : impl::KilnFuseActivationBase<FuseActivationPass> {
  void runOnOperation() override {
    llvm::SmallVector<ActivationOp> acts;
    getOperation().walk([&](ActivationOp a) { acts.push_back(a); });
    for (ActivationOp act : acts) {
      auto l = act.getInput().getDefiningOp<LinearOp>();
      if (!l) {
        act.emitRemark() << "kiln-fuse-activation: not fused: its input is not a kiln.linear";
        continue;
      }
      if (!onlyUser(l.getResult(), act) || l.getResidual() || l.getActivation()) {
        act.emitRemark() << "kiln-fuse-activation: not fused: " << nameOf(l)
                         << (l.getResidual() || l.getActivation() ? " already has an epilogue"
                                                                  : " is also read by other ops");
        continue;
      }
      mlir::OpBuilder b(l);
      LinearParts parts(l);
      parts.activation = act.getKindAttr();
      LinearOp fused = parts.build(b, l);
      copyKilnAttrs(l, fused);
      recordFused(fused, {l, act});
      act.emitRemark() << "kiln-fuse-activation: " << nameOf(act) << " ("
                         << stringifyActivationKind(act.getKind()) << ") fused as the epilogue of " << nameOf(l);
      act.getResult().replaceAllUsesWith(fused.getResult());
      act.erase();
      l.erase();
    }
  }
};

//===----------------------------------------------------------------------===//
// kiln-fuse-residual
//===----------------------------------------------------------------------===//

struct FuseResidualPass : impl::KilnFuseResidualBase<FuseResidualPass> {
  // `m` with `residual` as its residual, or null when it takes none.
  mlir::Operation* withResidual(mlir::OpBuilder& b, mlir::Operation* m, mlir::Value residual) {
    if (auto l = llvm::dyn_cast<LinearOp>(m)) {
      LinearParts parts(l);
      parts.residual = residual;
      return parts.build(b, l);
    }
    if (auto g = llvm::dyn_cast<GatedMlpOp>(m)) {
      GatedMlpParts parts(g);
      parts.residual = residual;
      return parts.build(b, g);
    }
    if (auto e = llvm::dyn_cast<MoeOp>(m))
      return b.create<MoeOp>(e.getLoc(), e.getType(), e.getInput(), residual, e.getRouter(), e.getGate(),
                             e.getUp(), e.getDown(), e.getTopKAttr(), e.getNormalizeTopKAttr(),
                             e.getActivationAttr(), e.getExpertIdsAttr());
    return nullptr;
  }

  static bool hasResidual(mlir::Operation* m) {
    if (auto l = llvm::dyn_cast<LinearOp>(m))
      return static_cast<bool>(l.getResidual());
    if (auto g = llvm::dyn_cast<GatedMlpOp>(m))
      return static_cast<bool>(g.getResidual());
    if (auto e = llvm::dyn_cast<MoeOp>(m))
      return static_cast<bool>(e.getResidual());
    return false;
  }

  // A position embedding added to a patch embedding read by nothing else: the patch
  // embedding's epilogue (SigLIP). CLIP's class token between them goes with it: the
  // patch embedding writes its patches from row 1 and the class embedding as row 0.
  void fusePositions() {
    llvm::SmallVector<PositionEmbeddingOp> positions;
    getOperation().walk([&](PositionEmbeddingOp p) { positions.push_back(p); });
    for (PositionEmbeddingOp pos : positions) {
      auto cls = pos.getInput().getDefiningOp<ClassTokenOp>();
      auto pe = (cls ? cls.getInput() : pos.getInput()).getDefiningOp<PatchEmbedOp>();
      std::string why;
      if (!pe)
        why = cls ? "the class token's input is not a kiln.patch_embed" : "its input is not a kiln.patch_embed";
      else if (!onlyUser(pe.getResult(), cls ? cls.getOperation() : pos.getOperation()))
        why = nameOf(pe) + " is also read by other ops";
      else if (cls && !onlyUser(cls.getResult(), pos))
        why = nameOf(cls) + " is also read by other ops";
      else if (pe.getPosition())
        why = nameOf(pe) + " already adds a position embedding";
      if (!why.empty()) {
        pos.emitRemark() << "kiln-fuse-residual: not fused: " << why;
        continue;
      }
      mlir::OpBuilder b(pos);  // after the table's weight_ref; the patch embedding's operands come before
      auto fused = b.create<PatchEmbedOp>(pe.getLoc(), pos.getType(), pe.getPixels(), pe.getWeight(), pe.getBias(),
                                          pos.getTable(), cls ? cls.getClassEmbedding() : mlir::Value(),
                                          pe.getPatchSizeAttr());
      copyKilnAttrs(pe, fused);
      if (cls) {
        recordFused(fused, {pe, cls, pos});
        pos.emitRemark() << "kiln-fuse-residual: " << nameOf(cls) << " and " << nameOf(pos)
                         << " fused as the epilogue of " << nameOf(pe);
      } else {
        recordFused(fused, {pe, pos});
        pos.emitRemark() << "kiln-fuse-residual: " << nameOf(pos) << " fused as the epilogue of " << nameOf(pe);
      }
      pos.getResult().replaceAllUsesWith(fused.getResult());
      pos.erase();
      if (cls)
        cls.erase();
      pe.erase();
    }
  }

  void runOnOperation() override {
    fusePositions();
    llvm::SmallVector<AddOp> adds;
    getOperation().walk([&](AddOp a) { adds.push_back(a); });
    for (AddOp add : adds) {
      std::string why = "neither operand is a matmul (kiln.linear, kiln.gated_mlp, kiln.moe)";
      bool done = false;
      for (auto [product, residual] : {std::pair{add.getRhs(), add.getLhs()}, std::pair{add.getLhs(), add.getRhs()}}) {
        mlir::Operation* m = product.getDefiningOp();
        if (!m || !llvm::isa<LinearOp, GatedMlpOp, MoeOp>(m))
          continue;
        if (!onlyUser(product, add)) {
          why = nameOf(m) + " is also read by other ops";
          continue;
        }
        if (hasResidual(m)) {
          why = nameOf(m) + " already adds a residual";
          continue;
        }
        if (product == residual || llvm::is_contained(m->getOperands(), residual)) {
          why = "the residual is also an operand of " + nameOf(m);
          continue;
        }
        if (!dominates(residual, m)) {
          why = "the residual is computed after " + nameOf(m);
          continue;
        }
        mlir::OpBuilder b(m);
        mlir::Operation* fused = withResidual(b, m, residual);
        copyKilnAttrs(m, fused);
        recordFused(fused, {m, add});
        fused->emitRemark() << "kiln-fuse-residual: " << nameOf(add) << " fused as the epilogue of " << nameOf(m);
        add.getResult().replaceAllUsesWith(fused->getResult(0));
        add.erase();
        m->erase();
        done = true;
        break;
      }
      if (!done)
        add.emitRemark() << "kiln-fuse-residual: not fused: " << why;
    }
  }
};

} // namespace
} // namespace kiln
