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
include "mlir/IR/AttrTypeBase.td"

def Kiln_Dialect : Dialect {
  let name = "kiln";
  let cppNamespace = "::kiln";
  let summary = "Multimodal language models at layer granularity";
  let description = [{
    The `kiln` dialect is the compiler's view of a vision-language model: an image
    encoder, a projector and a decoder language model, each a sequence of layer-level
    operations (normalisations, linear layers, attention, MLPs, mixture-of-experts
    blocks).

    **Module structure.** A model is a `builtin.module` holding

    * one `kiln.weight` symbol per weight tensor. A weight is referenced, never
      embedded: it names its source tensor (`#kiln.source`: file, byte offset,
      dtype), or an expression over several (`#kiln.concat`, `#kiln.slice`,
      `#kiln.permute`, `#kiln.weighted_sum`, whose leaves are sources: a weight
      expression), and
      carries the storage encoding (`#kiln.encoding`) that the precision passes
      choose and its layout in the artifact (`#kiln.layout`);
    * one `func.func` per stage, marked `kiln.stage = #kiln.stage<...>`:
      `vision_encoder`, `projector`, `decoder_prefill`, `decoder_decode` and
      `lm_head`. Timings and precision decisions are reported per stage. Decoder
      stages take token ids and positions; their attention ops are bound to a layer
      of the session's KV cache;
    * module attributes with what travels to the artifact: `kiln.architecture`,
      `kiln.checkpoint` (the source directory), `kiln.prompt_template`,
      `kiln.chat_template` (the chat template's pieces: a dictionary), and the
      typed configuration `kiln.text` (`#kiln.text_config`), `kiln.image`
      (`#kiln.image_config`), `kiln.preprocessor` (`#kiln.preprocessor_config`),
      `kiln.generation` (`#kiln.generation_config`) and `kiln.tokenizer`
      (`#kiln.tokenizer_config`); after kernel selection `kiln.target`
      (`#kiln.target`).

    Activations are f32 tensors whose leading dimension is the number of tokens
    (dynamic in decoder prefill). There is no batch dimension: a session serves one
    request at a time.
  }];
  let useDefaultAttributePrinterParser = 1;
  // Every discardable `kiln.*` attribute is checked: its type, where it may appear
  // and its values (KilnDialect.cpp); an unknown `kiln.*` name is an error.
  let hasOperationAttrVerify = 1;
  let extraClassDeclaration = [{
    void registerAttributes();
  }];
}

class Kiln_Op<string mnemonic, list<Trait> traits = []>
    : Op<Kiln_Dialect, mnemonic, traits>;

class Kiln_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Kiln_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

#endif // KILN_DIALECT_KILNBASE_TD
