// The runtime's tokenizer: Hugging Face byte-level BPE (GPT-2, Llama-3, Qwen2 style)
// and SentencePiece-style BPE (Llama-2, Mistral: TokenizerSpec::kMetaspace).
//
// Semantics follow tests/models/kiln_models/tokenizer.py (the reference the tests
// compare against, itself modelled on Hugging Face `tokenizers`):
//  - added tokens are found first, leftmost-longest, and are never split;
//  - the text between them is split into pre-tokens by the pre-tokenizer's regex
//    (regex.h: Perl semantics, `\s` is Unicode White_Space, letters and numbers from
//    Unicode 14.0.0's general categories, while Python's `regex` may know characters
//    added since);
//  - each pre-token's UTF-8 bytes become GPT-2 byte-level symbols and are merged by
//    rank: the lowest-ranked pair present is merged at every (non-overlapping,
//    left-to-right) occurrence, then the next lowest, as tokenizer.py does; with
//    ignore_merges a pre-token that is itself in the vocabulary is emitted whole;
//  - decoding maps byte-level characters back to bytes (a token holding a character
//    outside the byte-level alphabet decodes to its own UTF-8, as Hugging Face's
//    ByteLevel decoder does) and repairs ill-formed UTF-8 with U+FFFD exactly like
//    Python's bytes.decode("utf-8", errors="replace").
//
// Memory: every allocation goes through the Allocator given at Create.
#ifndef KILN_RUNTIME_TOKENIZER_TOKENIZER_H_
#define KILN_RUNTIME_TOKENIZER_TOKENIZER_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/kiln.h"
#include "support/allocator.h"
#include "support/vec.h"
#include "tokenizer/regex.h"

namespace kiln::rt {

// What the artifact says about its tokenizer. Every view points into memory that must
// outlive the Tokenizer made from it (the mmapped artifact).
struct TokenizerSpec {
  // kGpt2 and kLlama3: tokenizer.py's GPT2_PATTERN and LLAMA3_PATTERN. kSplit: the
  // regex in `pattern` (a tokenizer.json Split pre-tokenizer, e.g. Qwen2's), then the
  // byte-level mapping; the pattern is compiled by regex.h and need not outlive Create.
  // kMetaspace: SentencePiece-style BPE (Llama-2, Mistral) instead of byte-level: no
  // regex; each segment between added tokens gets `sentencepiece.prepend` (per its scheme) and
  // its spaces become U+2581; its characters are the initial symbols (a character
  // outside the vocabulary becomes its UTF-8 bytes as <0xXX> tokens with
  // byte_fallback, else unk_id, consecutive ones fused with fuse_unk); then the merges.
  // Decoding turns U+2581 into a space and <0xXX> tokens into bytes, and drops
  // decode_strip leading spaces of a decoded text.
  enum class PreTokenizer { kGpt2, kLlama3, kSplit, kMetaspace };
  PreTokenizer pretokenizer = PreTokenizer::kGpt2;
  enum class PrependScheme { kAlways, kFirst, kNever };
  struct SentencePiece {
    std::string_view prepend;
    PrependScheme prepend_scheme = PrependScheme::kAlways;
    bool byte_fallback = false;
    int32_t unk_id = -1;
    bool fuse_unk = false;
    int decode_strip = 0;
  } sentencepiece;  // kMetaspace only

  // The NFC normalizer (Qwen2), applied to each segment between added tokens before
  // pre-tokenisation, with the artifact's Unicode tables (formats/kiln.fbs: packed
  // canonical decompositions sorted by code point, primary composites sorted by pair,
  // combining classes sorted by code point; Hangul is algorithmic). Must outlive the
  // tokenizer.
  struct NfcTables {
    bool enabled = false;
    const uint64_t* decompositions = nullptr;
    size_t num_decompositions = 0;
    const uint64_t* compositions = nullptr;
    size_t num_compositions = 0;
    const uint32_t* classes = nullptr;
    size_t num_classes = 0;
  } nfc;
  // Used by kSplit only, in the syntax regex.h accepts (its \s and \S are Unicode
  // White_Space, as in the built-in patterns); text no alternative matches becomes a
  // pre-token of its own (HF's Split "Isolated"); a regex that regex.h refuses is
  // KILN_ERROR_ARTIFACT_TOKENIZER.
  std::string_view pattern;

  // vocab[id] = the token in byte-level form (UTF-8); "" = an id the model vocabulary
  // does not use. For the id of an added token, vocab[id] is "" or the added content
  // itself (GPT-2's <|endoftext|> is in both). Non-empty entries are distinct.
  const std::string_view* vocab = nullptr;
  size_t vocab_size = 0;  // number of ids (max id + 1), added tokens included

  // In rank order (index = rank). The result is the id of vocab[left] + vocab[right],
  // which must be in the vocabulary. A pair listed twice keeps its last rank (as a
  // Python dict or Rust HashMap built from the list does).
  struct Merge {
    uint32_t left, right;
  };
  const Merge* merges = nullptr;
  size_t num_merges = 0;

  // Added tokens: matched verbatim in the text before pre-tokenisation. Contents are
  // non-empty, valid UTF-8 and distinct; ids are distinct and < vocab_size. `special`
  // ones are dropped by Decode/AppendTokenBytes when asked to skip special tokens.
  struct Added {
    int32_t id;
    std::string_view content;
    bool special;
  };
  const Added* added = nullptr;
  size_t num_added = 0;

  int32_t bos_id = -1;  // prepended by Encode(add_special = true) when add_bos
  bool add_bos = false;
  bool ignore_merges = false;
};

// A byte-level BPE tokenizer. Immutable after Create: Encode, Decode and the lookups
// may be called from any number of threads at once (each call uses its own scratch
// memory, allocated from the tokenizer's Allocator).
class Tokenizer {
 public:
  // Validates `spec` (ids in range, vocabulary entries valid UTF-8 and distinct, all
  // 256 byte symbols present, every merge's operands and result in the vocabulary,
  // added tokens non-empty, distinct and consistent with the vocabulary, BOS valid
  // when added) and builds the lookup tables. Errors: KILN_ERROR_INVALID_ARGUMENT
  // (null allocator or out), KILN_ERROR_ARTIFACT_TOKENIZER (inconsistent data),
  // KILN_ERROR_OUT_OF_MEMORY. `allocator` must outlive the tokenizer; on success
  // *out owns the tables (release with Destroy).
  static kiln_status_t Create(const TokenizerSpec& spec, Allocator* allocator, Tokenizer** out,
                              kiln_error_t* error);
  // nullptr is a no-op.
  static void Destroy(Tokenizer* tokenizer);

  // Appends the ids of UTF-8 `text` to *out_ids (whose own allocator is used for it).
  // Added tokens written in the text are recognised. With add_special, BOS is
  // prepended when the tokenizer adds one. Errors: KILN_ERROR_INVALID_ARGUMENT (text
  // not well-formed UTF-8, longer than 2^31-1 bytes, or null pointers),
  // KILN_ERROR_OUT_OF_MEMORY, KILN_ERROR_INTERNAL (the pre-tokenizer regex
  // backtracked beyond its limit: patterns of real tokenizers do not). On error *out_ids is
  // left as it was.
  kiln_status_t Encode(const char* text, size_t length, bool add_special, Vec<int32_t>* out_ids,
                       kiln_error_t* error) const;

  // Appends the UTF-8 text of `ids` (no NUL); ill-formed byte sequences become U+FFFD.
  // With skip_special, special added tokens are left out. Errors:
  // KILN_ERROR_INPUT_TOKENS (an id outside [0, vocab_size) or an unused id),
  // KILN_ERROR_INVALID_ARGUMENT, KILN_ERROR_OUT_OF_MEMORY. On error *out_utf8 is left
  // as it was.
  kiln_status_t Decode(const int32_t* ids, size_t count, bool skip_special, Vec<char>* out_utf8,
                       kiln_error_t* error) const;

  // Appends the raw bytes one token stands for (possibly a fragment of a UTF-8
  // character): an added token's content (nothing when it is special and skip_special),
  // else its byte-level symbols mapped back to bytes. For streaming output, together
  // with Utf8CompleteLength below. Errors as Decode.
  kiln_status_t AppendTokenBytes(int32_t id, bool skip_special, Vec<char>* out,
                                 kiln_error_t* error) const;

  // The id of an added token's content, else of a vocabulary entry (byte-level form);
  // -1 when neither.
  int32_t TokenToId(std::string_view token) const;
  // True for the id of an added token marked special.
  bool IsSpecial(int32_t id) const;
  int32_t vocab_size() const { return vocab_size_; }
  // Leading spaces a decoded text drops (SentencePiece-style decoders strip the space
  // the encoder prepended); streaming output drops them from the first token's text.
  int decode_strip() const { return sp_.decode_strip; }
  int32_t bos_id() const { return bos_id_; }
  bool adds_bos() const { return add_bos_; }

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

 private:
  struct EncodeScratch;  // per-call working memory (tokenizer.cc)
  struct MergeSlot {
    uint32_t left;  // kEmptyKey when the slot is free
    uint32_t right;
    uint32_t rank;
    int32_t merged;
  };
  struct AddedToken {
    std::string_view content;
    int32_t id;
    bool special;
  };

  explicit Tokenizer(Allocator* allocator);
  ~Tokenizer();

  kiln_status_t Init(const TokenizerSpec& spec, kiln_error_t* error);
  int32_t FindVocab(const char* data, size_t size) const;
  bool FindMerge(int32_t left, int32_t right, uint32_t* rank, int32_t* merged) const;
  const AddedToken* FindAddedById(int32_t id) const;
  // Longest added token starting at text[pos], or nullptr.
  const AddedToken* MatchAdded(const char* text, size_t length, size_t pos) const;
  kiln_status_t EncodeSegment(const char* text, size_t length, bool at_start, EncodeScratch* scratch,
                              Vec<int32_t>* out, kiln_error_t* error) const;
  // NFC of text (well-formed UTF-8) into scratch->normalized. False when out of memory.
  bool Nfc(const char* text, size_t length, EncodeScratch* scratch) const;
  uint8_t CombiningClass(uint32_t cp) const;
  kiln_status_t EncodeMetaspace(const char* text, size_t length, bool at_start, EncodeScratch* scratch,
                                Vec<int32_t>* out, kiln_error_t* error) const;
  // BPE merges over scratch->symbols[0, n) (ids set), then their ids appended to *out.
  kiln_status_t MergeSymbols(size_t n, EncodeScratch* scratch, Vec<int32_t>* out,
                             kiln_error_t* error) const;
  kiln_status_t EncodePiece(const char* piece, size_t length, EncodeScratch* scratch,
                            Vec<int32_t>* out, kiln_error_t* error) const;
  kiln_status_t AppendBytes(int32_t id, bool skip_special, Vec<char>* out,
                            kiln_error_t* error) const;

  Allocator* allocator_;
  TokenizerSpec::PreTokenizer pretokenizer_ = TokenizerSpec::PreTokenizer::kGpt2;
  const std::string_view* vocab_ = nullptr;
  int32_t vocab_size_ = 0;
  int32_t bos_id_ = -1;
  bool add_bos_ = false;
  bool ignore_merges_ = false;
  bool metaspace_ = false;
  TokenizerSpec::SentencePiece sp_;  // kMetaspace
  TokenizerSpec::NfcTables nfc_;

  // Open addressing, linear probing, power-of-two capacities.
  Vec<int32_t> vocab_slots_;  // id, or -1 when free; keyed by vocab_[id]
  size_t vocab_mask_ = 0;
  Vec<MergeSlot> merge_slots_;
  size_t merge_mask_ = 0;

  // Added tokens sorted by (first byte, length descending); added_first_[b] ..
  // added_first_[b + 1] is the range starting with byte b.
  Vec<AddedToken> added_;
  uint32_t added_first_[257] = {};
  Vec<int32_t> added_by_id_;  // indices into added_, sorted by id

  // GPT-2's bytes_to_unicode: byte -> code point (all below 0x144) and back.
  uint16_t byte_to_cp_[256] = {};
  int16_t cp_to_byte_[0x144] = {};
  int32_t byte_ids_[256] = {};  // id of each single-byte symbol (kMetaspace: of <0xXX>)

  Regex regex_;  // the pre-tokenizer's (not kMetaspace)
};

// ---- UTF-8 helpers (no allocation except into `out`) ----

// True when [data, data + size) is well-formed UTF-8 (no overlong forms, surrogates or
// code points above U+10FFFF). Otherwise *bad_offset (if non-null) receives the offset
// of the first byte of the first ill-formed sequence.
bool IsValidUtf8(const char* data, size_t size, size_t* bad_offset);

// Appends `data` with every maximal ill-formed subsequence replaced by U+FFFD, as
// Python's bytes.decode("utf-8", errors="replace") does. False when out of memory
// (*out is then left as it was).
[[nodiscard]] bool AppendUtf8Replacing(const char* data, size_t size, Vec<char>* out);

// For streaming decode: the number of leading bytes of `data` that can be turned into
// text now. Only a trailing sequence that is a proper prefix of a well-formed UTF-8
// character (a lead byte and fewer continuation bytes than it needs, at most 3 bytes)
// is held back; ill-formed bytes count as complete (they become U+FFFD whatever
// follows). A caller keeps data[result..size) and prepends it to the next token's bytes.
size_t Utf8CompleteLength(const char* data, size_t size);

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_TOKENIZER_TOKENIZER_H_
