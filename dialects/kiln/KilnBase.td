//===- KilnBase.td - kiln dialect definition ---------------*- tablegen -*-===//
//
// The kiln dialect describes a multimodal language model at the granularity Kiln's
// passes reason about: layers, the weights they read, the precision each weight is
// stored in, and the stage (vision encoder, projector, decoder) each belongs to.
//
//===----------------------------------------------------------------------===//

#ifndef KILN_DIALECT_KILNBASE_TD
#define KILN_DIALECT_KILNBASE_TD

include "mlir/IR/OpBase.td"

def Kiln_Dialect : Dialect {
  let name = "kiln";
  let cppNamespace = "::kiln";
  let summary = "Multimodal language models at layer granularity";
  let description = [{
    The `kiln` dialect is the compiler's view of a vision-language model: an image
    encoder, a projector and a decoder language model, each a sequence of layer-level
    operations (normalisations, linear layers, attention, MLPs, mixture-of-experts
    blocks). Weights are referenced, never embedded, and carry the storage encoding
    that Kiln's precision passes choose.
  }];
}

class Kiln_Op<string mnemonic, list<Trait> traits = []>
    : Op<Kiln_Dialect, mnemonic, traits>;

#endif // KILN_DIALECT_KILNBASE_TD
