//===- TokenizerJson.h - Hugging Face tokenizer.json reader ------*- C++ -*-===//
//
// Reads a BPE tokenizer.json into the vocabulary, merges, added tokens and BOS rule
// the artifact stores: byte-level (GPT-2 ByteLevel, or Split regex + ByteLevel as
// Llama-3 and Qwen2 use) or SentencePiece-style (Llama-2, Mistral: the "\u2581"
// space, byte_fallback). Anything the runtime's tokenizer cannot reproduce
// exactly is refused with a message naming the field.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_IMPORTERS_TOKENIZER_TOKENIZERJSON_H
#define KILN_COMPILER_IMPORTERS_TOKENIZER_TOKENIZERJSON_H

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "llvm/ADT/StringRef.h"

namespace kiln {

struct TokenizerData {
  /// Gpt2: ByteLevel with GPT-2's regex. Split: `pattern`, then ByteLevel.
  /// Metaspace: SentencePiece-style BPE (Llama-2, Mistral: a Prepend + Replace
  /// normalizer or a Metaspace pre-tokenizer, byte_fallback).
  enum class PreTokenizer { Gpt2, Split, Metaspace };
  PreTokenizer pretokenizer = PreTokenizer::Gpt2;
  std::string pattern;
  std::vector<std::string> vocab;                    // index = id; "" for ids without a token
  std::vector<std::pair<uint32_t, uint32_t>> merges; // rank order
  struct Added {
    int32_t id;
    std::string content;
    bool special;
  };
  std::vector<Added> added;
  int32_t bosId = -1;
  bool addBos = false;
  bool ignoreMerges = false;
  // Metaspace only.
  enum class PrependScheme { Always, First, Never };
  std::string prepend;  // "\u2581"
  PrependScheme prependScheme = PrependScheme::Always;
  bool byteFallback = false;
  int32_t unkId = -1;
  bool fuseUnk = false;
  int decodeStrip = 0;  // leading spaces the decoder strips
  bool nfc = false;     // the NFC normalizer (Qwen2): the artifact carries the Unicode tables
};

/// The Unicode data of the NFC normalizer (scripts/gen_unicode_nfc.py).
struct UnicodeNfcTables {
  const char* version;
  const uint64_t* decompositions;
  size_t numDecompositions;
  const uint64_t* compositions;
  size_t numCompositions;
  const uint32_t* combiningClasses;
  size_t numCombiningClasses;
};
const UnicodeNfcTables& unicodeNfcTables();

/// Reads `path` into `tok`; on failure returns a message that starts with
/// "tokenizer.json: ".
std::optional<std::string> readTokenizerJson(llvm::StringRef path, TokenizerData& tok);

} // namespace kiln

#endif // KILN_COMPILER_IMPORTERS_TOKENIZER_TOKENIZERJSON_H
