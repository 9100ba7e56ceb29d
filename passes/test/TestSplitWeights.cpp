//===- TestSplitWeights.cpp - weight expressions for testing -----*- C++ -*-===//
//
// Test only (kiln-opt --kiln-test-split-weights): rewrites every weight read from
// one plain #kiln.source as an expression over that source with the same value,
// so that an artifact written from the result must equal the original's weight
// bytes: that checks the writer's evaluation of concat, slice and permute.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/KilnOps.h"
#include "passes/Passes.h"

namespace kiln {
#define GEN_PASS_DEF_KILNTESTSPLITWEIGHTS
#include "passes/Passes.h.inc"

namespace {

struct TestSplitWeightsPass : impl::KilnTestSplitWeightsBase<TestSplitWeightsPass> {
  void runOnOperation() override {
    mlir::MLIRContext* ctx = &getContext();
    for (WeightOp w : getOperation().getOps<WeightOp>()) {
      SourceAttr plain = w.getPlainSource();
      llvm::ArrayRef<int64_t> shape = w.getTensorType().getShape();
      if (!plain || shape.empty() || shape.size() > 2 ||
          llvm::any_of(shape, [](int64_t d) { return d < 2; }))
        continue;
      auto x = SourceAttr::get(ctx, plain.getFile(), plain.getOffset(), plain.getSize(),
                               plain.getDtype(), shape);
      int64_t rows = shape[0], r = rows / 2;
      mlir::Attribute expr;
      if (shape.size() == 1) {
        // [n] = concat(x[0, n/2), x[n/2, n))
        expr = ConcatAttr::get(ctx, 0,
                               {SliceAttr::get(ctx, x, {0}, {r}), SliceAttr::get(ctx, x, {r}, {rows - r})});
      } else {
        // [R, C] = concat<axis 0>(concat<axis 1>(top left, top right),
        //                         permute(permute(bottom, [1, 0]), [1, 0]))
        int64_t cols = shape[1], c = cols / 2;
        mlir::Attribute top = ConcatAttr::get(
            ctx, 1,
            {SliceAttr::get(ctx, x, {0, 0}, {r, c}), SliceAttr::get(ctx, x, {0, c}, {r, cols - c})});
        mlir::Attribute bottom = PermuteAttr::get(
            ctx, PermuteAttr::get(ctx, SliceAttr::get(ctx, x, {r, 0}, {rows - r, cols}), {1, 0}),
            {1, 0});
        expr = ConcatAttr::get(ctx, 0, {top, bottom});
      }
      w.setSourceAttr(llvm::cast<WeightExprAttrInterface>(expr));
    }
  }
};

} // namespace
} // namespace kiln
