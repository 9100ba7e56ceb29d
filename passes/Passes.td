//===- Passes.td - Kiln passes (the one registry) ----------*- tablegen -*-===//
//
// Every compiler pass of Kiln, each a kiln-opt flag of the form kiln-<verb>[-<noun>].
//
//===----------------------------------------------------------------------===//

#ifndef KILN_PASSES_TD
#define KILN_PASSES_TD

include "mlir/Pass/PassBase.td"

def KilnSelectKernels : Pass<"kiln-select-kernels", "::mlir::ModuleOp"> {
  let summary = "Bind every op of every stage to a kernel of the target";
  let description = [{
    Annotates each kiln op inside a stage function with `kiln.kernel`, the name of
    the kernel (formats/kernels.def) that runs it on the target. The choice is made
    at compile time, so that no op falls back silently at run time: an op whose
    weight encoding no kernel of the target accepts is an error naming the op.
    Of the kernels of formats/kernels.def that run the op's kind, read its
    weights' encodings and need no CPU feature the target lacks, the most
    specialised (most CPU features) is chosen, the first in table order among
    equals; every binding is reported as a remark (kernel, ISA, features), and a
    binding to a portable reference kernel says so. The artifact's required CPU
    features are derived from the bound kernels. The target defaults to the host
    with the CPU features it detects; `target=portable` binds the reference
    kernels. Generated kernels (`kernels=generated`, the default) rank above the
    hand-written ones, so that every op the generator serves runs code generated
    for the model (an op bound to a hand-written kernel then says why in its
    remark); `kernels=hand-written` ranks the hand-written kernels for the
    target's features first, for comparisons.

    No fallback: on a CPU target (anything but `portable`), an op of a kind that
    has generated or hand-written kernels must be bound to one; when none
    qualifies (a weight encoding the generator does not read on that target, a
    missing CPU feature) it is an error naming the op and why, unless the op's
    name matches `allow-portable-ops` (then a remark says it runs the reference
    kernel). Kinds that only the runtime's copies run (slices, concatenation,
    class token, image-token merge, pixel shuffle) have no such kernels.

    Example:

    ```mlir
    %y = kiln.linear %x, %w {kiln.kernel = "ref_linear"} : ...
    ```
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"\"",
           "host (default: this machine, detected CPU features), portable, or a triple; an unknown triple is an error">,
    Option<"cpuFeatures", "cpu-features", "std::string", /*default=*/"\"\"",
           "CPU features the target has, e.g. +avx2,+fma or +dotprod,+i8mm">,
    Option<"allowPortableOps", "allow-portable-ops", "std::string", /*default=*/"\"\"",
           "ops (a regex over the whole op name) that may run a portable reference kernel on a CPU target">,
    Option<"kernels", "kernels", "std::string", /*default=*/"\"generated\"",
           "generated (the default: kernels generated for the model first; hand-written ones only for ops the "
           "generator cannot serve, with a remark) or hand-written (hand-written kernels for the target's "
           "features first, then generated ones; for comparisons)">,
  ];
}

def KilnPackWeights : Pass<"kiln-pack-weights", "::mlir::ModuleOp"> {
  let summary = "Store weights in the packed layouts of the kernels that read them";
  let description = [{
    Runs after `kiln-select-kernels`. A weight whose every reader is bound to a
    kernel that reads a packed layout is given that layout (`#kiln.layout`); the
    artifact writer rearranges its bytes at compile time, and the runtime maps them
    as they are (no repacking at load).

    Three layouts (formats/encoding.h): `int4_p16k8` and `int8_p16k4`, for
    symmetric int4 (group a multiple of 8) and int8 (input dimension a multiple of
    4) weights that the generated matmuls multiply with int8 per-token activations
    (W4A8, W8A8: linear, LM head, gated MLP, mixture of experts, patch embedding):
    rows in panels of 16, for each step of 8 (int4, the two halves in the low and
    high nibbles) or 4 (int8) columns each row's 4 bytes, so that one 64-byte load
    is a panel's operand of a 4-element dot product per output channel against a
    row's broadcast activations; `panel16`, for f32, f16 and bf16 matmul weights of
    the generated float matmuls: rows in panels of 16 stored column by column, so
    that the kernel multiplies a broadcast activation by a panel's column. The
    generated embedding gather reads `int4_p16k8` too, so that an embedding table
    tied to a W4A8 LM head is packed for the head; a weight that only gathers read,
    or that another kernel also reads (a float table tied to the LM head, an op
    allowed onto the reference kernels), stays row major.

    Example:

    ```mlir
    kiln.weight @w : tensor<64x64xf32> from ... as #kiln.encoding<int4, group_size = 32, activation = int8_per_token>
        layout #kiln.layout<int4_p16k8>
    ```
  }];
}

def KilnPlanMemory : Pass<"kiln-plan-memory", "::mlir::ModuleOp"> {
  let summary = "Place every activation of every stage in a static arena";
  let description = [{
    Computes, for each stage function, the size of every op result at the largest
    token count the stage is planned for (`max-prefill-tokens` for the dynamic token
    dimension of prefill), its lifetime in program order, and an offset in the
    stage's arena such that buffers alive at the same time never overlap. Buffers
    are 64-byte aligned and reused as soon as their last reader has run; element-wise
    ops and normalisations write in place over an input that dies with them.

    Results: `kiln.offset` on each op (byte offset in the arena) or `kiln.output`
    (the index of the stage result it is written to), `kiln.arena_bytes` on each
    stage function and `kiln.max_prefill_tokens` on the module.
  }];
  let options = [
    Option<"maxPrefillTokens", "max-prefill-tokens", "int64_t", /*default=*/"512",
           "Token bound of one prefill step (longer prompts are chunked)">,
  ];
}

def KilnAssignPrecision : Pass<"kiln-assign-precision", "::mlir::ModuleOp"> {
  let summary = "Choose the storage encoding of every weight under a memory budget";
  let description = [{
    Picks one encoding per weight so that the weights fit `memory-budget` bytes (or
    `bits-per-weight` on average) with the least total sensitivity: a
    multiple-choice knapsack over each weight's candidates, solved by Lagrangian
    relaxation and then greedily refined with the budget left over.

    A weight's candidates and their measured sensitivities come from its
    `kiln.sensitivity` attribute (`{label = KL, ...}`, written by calibration); its
    checkpoint encoding is always a candidate, with sensitivity 0. Weights without
    the attribute keep their encoding. `precision` overrides, `REGEX=ENCODING` in
    the manner of llama.cpp's --tensor-type, fix the encoding of every weight whose
    name the regex matches (the first matching override wins).

    Every decision is reported as a remark on its weight; a budget that even the
    smallest candidates cannot meet is an error that states the smallest budget
    that would fit.

    ```mlir
    kiln.weight @w : tensor<64x64xf32> from #kiln.source<...> as #kiln.encoding<f32>
        {kiln.sensitivity = {int8 = 1.0e-05 : f64, int4_g32 = 2.0e-03 : f64}}
    // kiln-assign-precision{memory-budget=9000} ->
    kiln.weight @w : tensor<64x64xf32> from #kiln.source<...> as #kiln.encoding<int8> ...
    ```
  }];
  let options = [
    Option<"memoryBudget", "memory-budget", "std::string", /*default=*/"\"\"",
           "Weight bytes allowed: 1.2GB (10^9), 800MiB (2^20), or a number of bytes">,
    Option<"bitsPerWeight", "bits-per-weight", "double", /*default=*/"0.0",
           "Average bits per weight parameter, scales included (instead of a budget)">,
    ListOption<"precision", "precision", "std::string",
               "REGEX=ENCODING overrides, e.g. 'vision_tower.*=bf16'">,
  ];
}

//===----------------------------------------------------------------------===//
// Test passes (kiln-opt only; library KilnTestPasses)
//===----------------------------------------------------------------------===//

def KilnTestSplitWeights : Pass<"kiln-test-split-weights", "::mlir::ModuleOp"> {
  let summary = "Test only: rewrite every weight as an equivalent weight expression";
  let description = [{
    Rewrites every weight whose values are one plain `#kiln.source` and whose type
    has rank 1 or 2 with every dimension at least 2 as an expression over that
    source with the same value: a [R, C] weight becomes the concatenation (axis 0)
    of its top rows, itself the concatenation (axis 1) of two slices, and its bottom
    rows, a slice transposed twice; a [N] weight the concatenation of two slices.
    An artifact written from the result must hold the same weight bytes as one
    written from the input (tests/e2e/test_weight_transforms.py).

    ```mlir
    kiln.weight @w : tensor<4x6xf32> from #kiln.source<"m.safetensors", offset = 0, size = 96, dtype = "F32">
        as #kiln.encoding<f32>
    // ->
    kiln.weight @w : tensor<4x6xf32> from #kiln.concat<axis = 0, [
        #kiln.concat<axis = 1, [#kiln.slice<X, offsets = [0, 0], sizes = [2, 3]>,
                                #kiln.slice<X, offsets = [0, 3], sizes = [2, 3]>]>,
        #kiln.permute<#kiln.permute<#kiln.slice<X, offsets = [2, 0], sizes = [2, 6]>,
                                    dims = [1, 0]>, dims = [1, 0]>]>
        as #kiln.encoding<f32>
    // with X = #kiln.source<"m.safetensors", offset = 0, size = 96, dtype = "F32", shape = [4, 6]>
    ```
  }];
}

#endif // KILN_PASSES_TD
