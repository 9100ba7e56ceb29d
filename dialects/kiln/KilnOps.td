//===- KilnOps.td - kiln dialect operations ----------------*- tablegen -*-===//

#ifndef KILN_DIALECT_KILNOPS_TD
#define KILN_DIALECT_KILNOPS_TD

include "dialects/kiln/KilnBase.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Kiln_RmsNormOp : Kiln_Op<"rms_norm", [Pure]> {
  let summary = "Root-mean-square normalisation over the last dimension";
  let description = [{
    Normalises every row of `input` (the last dimension) by its root mean square and
    scales it element-wise by `weight`, as Llama's `LlamaRMSNorm` does:

    ```
    y = x / sqrt(mean(x * x) + epsilon) * weight
    ```

    The mean is taken in f32 whatever the element type. `weight` is a 1-D tensor whose
    length equals the last dimension of `input`; the result has the type of `input`.

    Example:

    ```mlir
    %y = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32}
        : tensor<?x576xf32>, tensor<576xf32> -> tensor<?x576xf32>
    ```
  }];

  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$weight,
                       F32Attr:$epsilon);
  let results = (outs AnyRankedTensor:$result);

  let assemblyFormat = [{
    $input `,` $weight attr-dict `:` type($input) `,` type($weight) `->` type($result)
  }];
  let hasVerifier = 1;
}

#endif // KILN_DIALECT_KILNOPS_TD
