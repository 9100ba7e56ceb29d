//===- TokenizerJson.h - Hugging Face tokenizer.json reader ------*- C++ -*-===//
//
// Reads a byte-level BPE tokenizer.json (GPT-2 ByteLevel, or Split regex +
// ByteLevel as Llama-3 and Qwen2 use) into the vocabulary, merges, added tokens and
// BOS rule the artifact stores. Anything the runtime's tokenizer cannot reproduce
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
  enum class PreTokenizer { Gpt2, Split };
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
};

/// Reads `path` into `tok`; on failure returns a message that starts with
/// "tokenizer.json: ".
std::optional<std::string> readTokenizerJson(llvm::StringRef path, TokenizerData& tok);

} // namespace kiln

#endif // KILN_COMPILER_IMPORTERS_TOKENIZER_TOKENIZERJSON_H
