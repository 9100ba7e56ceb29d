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
    Today every op binds to a portable reference kernel; target-specific kernels
    take precedence once they exist, and binding an op to a reference kernel on a
    target that has faster ones is reported as a remark.

    Example:

    ```mlir
    %y = kiln.linear %x, %w {kiln.kernel = "ref_linear"} : ...
    ```
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"\"",
           "Target triple (default: the host)">,
  ];
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

#endif // KILN_PASSES_TD
