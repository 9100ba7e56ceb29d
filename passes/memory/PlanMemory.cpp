//===- PlanMemory.cpp - static arena planning per stage ----------*- C++ -*-===//
//
// Greedy-by-size placement (as TFLite's arena planner): buffers are sorted by
// size, largest first, and each takes the lowest offset at which it overlaps no
// already placed buffer whose lifetime intersects its own.
//
//===----------------------------------------------------------------------===//
#include <algorithm>

#include "dialects/kiln/KilnOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "passes/Encoding.h"
#include "passes/OpTable.h"
#include "passes/Passes.h"

namespace kiln {
#define GEN_PASS_DEF_KILNPLANMEMORY
#include "passes/Passes.h.inc"

namespace {

constexpr uint64_t kAlign = 64;

uint64_t alignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

struct Buffer {
  uint64_t size = 0;
  int64_t start = 0; // op index of the first writer
  int64_t end = 0;   // op index of the last reader
  uint64_t offset = 0;
  llvm::SmallVector<mlir::Operation*> writers;
};

// The operand an op's kernel may write its result over (formats/ops.def: an input,
// counted among the operands that are not weights), or null. Never one the op also
// reads as another operand (a residual that is also a linear's input), except for the
// gated MLP, which has read all of its input (gate and up) before it writes.
mlir::Value inPlaceOperand(mlir::Operation* op) {
  const format::OpInfo* info = opInfo(op);
  if (!info || info->in_place < 0)
    return nullptr;
  int input = 0;
  mlir::Value found;
  for (mlir::Value v : op->getOperands()) {
    if (v.getDefiningOp<WeightRefOp>())
      continue;
    if (input++ == info->in_place)
      found = v;
  }
  if (found && !llvm::isa<GatedMlpOp>(op) && llvm::count(op->getOperands(), found) > 1)
    return nullptr;
  return found;
}

struct PlanMemoryPass : impl::KilnPlanMemoryBase<PlanMemoryPass> {
  using KilnPlanMemoryBase::KilnPlanMemoryBase;

  mlir::LogicalResult planStage(mlir::func::FuncOp fn) {
    llvm::SmallVector<mlir::Operation*> ops;
    for (mlir::Operation& op : fn.getBody().front())
      ops.push_back(&op);
    llvm::DenseMap<mlir::Operation*, int64_t> index;
    for (auto [i, op] : llvm::enumerate(ops))
      index[op] = static_cast<int64_t>(i);

    // Values returned by the stage live in session buffers, not in the arena.
    auto ret = llvm::cast<mlir::func::ReturnOp>(fn.getBody().front().getTerminator());
    llvm::DenseMap<mlir::Value, int64_t> outputIndex;
    for (auto [i, v] : llvm::enumerate(ret.getOperands()))
      outputIndex.try_emplace(v, static_cast<int64_t>(i));

    std::vector<Buffer> buffers;
    llvm::DenseMap<mlir::Value, size_t> bufferOf;
    auto lastUse = [&](mlir::Value v) {
      int64_t last = index[v.getDefiningOp()];
      for (mlir::Operation* user : v.getUsers())
        last = std::max(last, index[user]);
      return last;
    };

    for (mlir::Operation* op : ops) {
      if (op->getNumResults() != 1 || llvm::isa<WeightRefOp>(op))
        continue;
      mlir::Value result = op->getResult(0);
      auto type = llvm::dyn_cast<mlir::RankedTensorType>(result.getType());
      if (!type || !type.getElementType().isF32())
        return op->emitOpError("kiln-plan-memory: result must be an f32 tensor, got ")
               << result.getType();
      if (outputIndex.count(result)) {
        op->setAttr("kiln.output",
                    mlir::IntegerAttr::get(mlir::IntegerType::get(op->getContext(), 64),
                                           outputIndex[result]));
        continue;
      }
      uint64_t elems = 1;
      for (auto [d, dim] : llvm::enumerate(type.getShape())) {
        int64_t size = dim;
        if (mlir::ShapedType::isDynamic(size)) {
          if (d != 0)
            return op->emitOpError("kiln-plan-memory: only the leading (token) dimension may be "
                                   "dynamic, got ")
                   << type;
          size = maxPrefillTokens;
        }
        elems *= static_cast<uint64_t>(size);
      }
      uint64_t bytes = alignUp(elems * 4);
      int64_t here = index[op];
      int64_t last = lastUse(result);

      // Run in place over the operand ops.def allows when it dies here and is the
      // same size.
      if (mlir::Value in = inPlaceOperand(op)) {
        auto it = bufferOf.find(in);
        if (it != bufferOf.end() && buffers[it->second].end == here &&
            buffers[it->second].size == bytes) {
          Buffer& b = buffers[it->second];
          b.end = std::max(b.end, last);
          b.writers.push_back(op);
          bufferOf[result] = it->second;
          continue;
        }
      }
      Buffer b;
      b.size = bytes;
      b.start = here;
      b.end = last;
      b.writers.push_back(op);
      bufferOf[result] = buffers.size();
      buffers.push_back(std::move(b));
    }

    // Greedy by size.
    std::vector<size_t> order(buffers.size());
    for (size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return buffers[a].size != buffers[b].size ? buffers[a].size > buffers[b].size : a < b;
    });
    std::vector<size_t> placed;
    uint64_t arena = 0;
    for (size_t i : order) {
      Buffer& b = buffers[i];
      // Address ranges of placed buffers alive at the same time, by offset.
      llvm::SmallVector<std::pair<uint64_t, uint64_t>> busy;
      for (size_t j : placed) {
        const Buffer& o = buffers[j];
        if (o.start <= b.end && b.start <= o.end)
          busy.push_back({o.offset, o.offset + o.size});
      }
      llvm::sort(busy);
      uint64_t offset = 0;
      for (auto [lo, hi] : busy) {
        if (offset + b.size <= lo)
          break;
        offset = std::max(offset, hi);
      }
      b.offset = offset;
      arena = std::max(arena, offset + b.size);
      placed.push_back(i);
    }

    auto i64 = mlir::IntegerType::get(fn.getContext(), 64);
    for (const Buffer& b : buffers)
      for (mlir::Operation* w : b.writers)
        w->setAttr("kiln.offset", mlir::IntegerAttr::get(i64, static_cast<int64_t>(b.offset)));
    fn->setAttr("kiln.arena_bytes", mlir::IntegerAttr::get(i64, static_cast<int64_t>(arena)));
    return mlir::success();
  }

  void runOnOperation() override {
    mlir::ModuleOp module = getOperation();
    if (maxPrefillTokens < 1) {
      module.emitError("kiln-plan-memory: max-prefill-tokens must be positive");
      return signalPassFailure();
    }
    module->setAttr("kiln.max_prefill_tokens",
                    mlir::IntegerAttr::get(mlir::IntegerType::get(module.getContext(), 64),
                                           maxPrefillTokens));
    auto text = module->getAttrOfType<TextConfigAttr>("kiln.text");
    KvCacheAttr kv = kvCacheEncoding(module.getContext(), kvCache, text ? text.getHeadDim() : 0);
    if (!kv) {
      module.emitError("kiln-plan-memory: kv-cache must be f32, f16, int8 or int4, got '") << kvCache << "'";
      return signalPassFailure();
    }
    if (text && !format::KvEncodingValid(static_cast<uint8_t>(kv.getKind()), static_cast<uint32_t>(kv.getGroup()),
                                         static_cast<uint32_t>(text.getHeadDim()))) {
      module.emitError("kiln-plan-memory: an ") << kvCache << " KV cache needs an even head_dim, got "
                                                << text.getHeadDim();
      return signalPassFailure();
    }
    module->setAttr("kiln.kv_cache", kv);
    for (auto fn : module.getOps<mlir::func::FuncOp>()) {
      if (!fn->hasAttr("kiln.stage") || fn.isExternal())
        continue;
      if (mlir::failed(planStage(fn)))
        return signalPassFailure();
    }
  }
};

} // namespace
} // namespace kiln
