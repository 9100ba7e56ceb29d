//===- TokenizerJson.cpp - Hugging Face tokenizer.json reader ----*- C++ -*-===//
#include "compiler/importers/tokenizer/TokenizerJson.h"

#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

namespace kiln {
namespace {
#include "compiler/importers/tokenizer/UnicodeNfc.inc"
} // namespace

const UnicodeNfcTables& unicodeNfcTables() {
  static const UnicodeNfcTables tables = {
      kUnicodeNfcVersion,
      kUnicodeNfcDecompositions,
      sizeof(kUnicodeNfcDecompositions) / sizeof(kUnicodeNfcDecompositions[0]),
      kUnicodeNfcCompositions,
      sizeof(kUnicodeNfcCompositions) / sizeof(kUnicodeNfcCompositions[0]),
      kUnicodeNfcCombiningClasses,
      sizeof(kUnicodeNfcCombiningClasses) / sizeof(kUnicodeNfcCombiningClasses[0])};
  return tables;
}

namespace {

using PreTokenizer = TokenizerData::PreTokenizer;

// Finds the BOS of a TemplateProcessing post-processor ("single": [SpecialToken, A]).
void readTemplate(const llvm::json::Object& post, TokenizerData& tok,
                  const std::map<std::string, int32_t>& ids) {
  const llvm::json::Array* single = post.getArray("single");
  if (!single || single->empty())
    return;
  const llvm::json::Object* first = (*single)[0].getAsObject();
  const llvm::json::Object* special = first ? first->getObject("SpecialToken") : nullptr;
  if (!special)
    return;
  auto name = special->getString("id");
  if (!name)
    return;
  // The special_tokens map gives the ids; fall back to the vocabulary.
  int32_t id = -1;
  if (const llvm::json::Object* table = post.getObject("special_tokens"))
    if (const llvm::json::Object* entry = table->getObject(*name))
      if (const llvm::json::Array* list = entry->getArray("ids"))
        if (!list->empty() && (*list)[0].getAsInteger())
          id = static_cast<int32_t>(*(*list)[0].getAsInteger());
  if (id < 0) {
    auto it = ids.find(name->str());
    if (it != ids.end())
      id = it->second;
  }
  if (id >= 0) {
    tok.bosId = id;
    tok.addBos = true;
  }
}

} // namespace

std::optional<std::string> readTokenizerJson(llvm::StringRef path, TokenizerData& tok) {
  auto fail = [](const llvm::Twine& msg) -> std::optional<std::string> {
    return ("tokenizer.json: " + msg).str();
  };
  // Only a regular file (symlinks followed): a FIFO would block the open forever.
  int fd = ::open(path.str().c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return fail("cannot read: " + llvm::Twine(std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail("not a regular file");
  }
  auto buffer = llvm::MemoryBuffer::getOpenFile(fd, path, st.st_size);
  ::close(fd);
  if (!buffer)
    return fail("cannot read: " + buffer.getError().message());
  auto parsed = llvm::json::parse((*buffer)->getBuffer());
  if (!parsed)
    return fail("not valid JSON: " + llvm::toString(parsed.takeError()));
  const llvm::json::Object* root = parsed->getAsObject();
  const llvm::json::Object* model = root ? root->getObject("model") : nullptr;
  if (!model || model->getString("type") != std::optional<llvm::StringRef>("BPE"))
    return fail("model.type must be \"BPE\" (byte-level and SentencePiece-style BPE tokenizers are supported)");
  // SentencePiece style (Llama-2, Mistral, TinyLlama, llava-1.5): "\u2581" for spaces,
  // from a Prepend + Replace normalizer (pre_tokenizer null) or a Metaspace
  // pre-tokenizer; characters outside the vocabulary as byte tokens (byte_fallback).
  const std::string kSpace = "\xE2\x96\x81";  // U+2581
  bool metaspace = false;
  {
    const llvm::json::Value* pre = root->get("pre_tokenizer");
    const llvm::json::Object* preObj = pre ? pre->getAsObject() : nullptr;
    const llvm::json::Value* n = root->get("normalizer");
    const llvm::json::Object* norm = n ? n->getAsObject() : nullptr;
    auto isType = [](const llvm::json::Object* o, llvm::StringRef t) {
      return o && o->getString("type") == std::optional<llvm::StringRef>(t);
    };
    if (isType(preObj, "Metaspace")) {
      metaspace = true;
      auto replacement = preObj->getString("replacement");
      if (replacement && *replacement != kSpace)
        return fail("Metaspace replacement '" + *replacement + "' is not supported (only U+2581)");
      if (preObj->getBoolean("split").value_or(false))
        return fail("Metaspace split = true is not supported");
      std::optional<llvm::StringRef> scheme = preObj->getString("prepend_scheme");
      bool addPrefix = preObj->getBoolean("add_prefix_space").value_or(true);
      tok.prepend = kSpace;
      if (scheme == std::optional<llvm::StringRef>("first"))
        tok.prependScheme = TokenizerData::PrependScheme::First;
      else if (scheme == std::optional<llvm::StringRef>("never") || (!scheme && !addPrefix))
        tok.prependScheme = TokenizerData::PrependScheme::Never;
      else if (scheme && *scheme != "always")
        return fail("Metaspace prepend_scheme '" + *scheme + "' is not supported");
      if (n && n->kind() != llvm::json::Value::Null &&
          !(isType(norm, "Sequence") && norm->getArray("normalizers") && norm->getArray("normalizers")->empty()))
        return fail("a normalizer beside the Metaspace pre-tokenizer is not supported");
    } else if ((!pre || pre->kind() == llvm::json::Value::Null) && isType(norm, "Sequence")) {
      // [Prepend("\u2581"), Replace(" " -> "\u2581")] in either order.
      const llvm::json::Array* steps = norm->getArray("normalizers");
      bool replaced = false, prepended = false;
      for (size_t i = 0; steps && i < steps->size(); ++i) {
        const llvm::json::Object* step = (*steps)[i].getAsObject();
        if (isType(step, "Prepend") && step->getString("prepend") && !prepended) {
          tok.prepend = step->getString("prepend")->str();
          prepended = true;
        } else if (isType(step, "Replace") && step->getObject("pattern") &&
                   step->getObject("pattern")->getString("String") == std::optional<llvm::StringRef>(" ") &&
                   step->getString("content") == std::optional<llvm::StringRef>(kSpace) && !replaced) {
          replaced = true;
        } else {
          return fail("normalizer step " + llvm::Twine(i) +
                      " is not supported (SentencePiece-style files use Prepend and Replace(' ' -> U+2581))");
        }
      }
      if (!replaced)
        return fail("a normalizer without Replace(' ' -> U+2581) is not supported");
      metaspace = true;
      tok.prependScheme = prepended ? TokenizerData::PrependScheme::Always : TokenizerData::PrependScheme::Never;
    }
  }
  if (metaspace) {
    tok.pretokenizer = PreTokenizer::Metaspace;
    tok.byteFallback = model->getBoolean("byte_fallback").value_or(false);
    tok.fuseUnk = model->getBoolean("fuse_unk").value_or(false);
  } else if (model->getBoolean("byte_fallback").value_or(false)) {
    return fail("byte_fallback is supported with SentencePiece-style files only (a Prepend + Replace "
                "normalizer or a Metaspace pre-tokenizer)");
  }
  // Fields that change nothing when empty are accepted empty (Qwen2-family files
  // write "continuing_subword_prefix": "" and empty normalizer sequences).
  for (llvm::StringRef key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const llvm::json::Value* v = model->get(key); v && v->kind() != llvm::json::Value::Null) {
      std::optional<llvm::StringRef> text = v->getAsString();
      if (!text)
        return fail("model." + key + " must be a string or null");
      if (!text->empty())
        return fail("model." + key + " '" + *text + "' is not supported (only empty or null)");
    }
  if (const llvm::json::Value* n = root->get("normalizer"); !metaspace && n && n->kind() != llvm::json::Value::Null) {
    // Byte-level files: none, NFC (Qwen2), or a Sequence of at most that.
    const llvm::json::Object* normalizer = n->getAsObject();
    std::optional<llvm::StringRef> type = normalizer ? normalizer->getString("type") : std::nullopt;
    const llvm::json::Array* steps = normalizer ? normalizer->getArray("normalizers") : nullptr;
    auto isNfc = [](const llvm::json::Object* o) {
      return o && o->getString("type") == std::optional<llvm::StringRef>("NFC");
    };
    if (isNfc(normalizer)) {
      tok.nfc = true;
    } else if (type == std::optional<llvm::StringRef>("Sequence") && steps &&
               (steps->empty() || (steps->size() == 1 && isNfc((*steps)[0].getAsObject())))) {
      tok.nfc = !steps->empty();
    } else {
      std::string name = type ? "'" + type->str() + "'" : std::string("(no type)");
      if (type == std::optional<llvm::StringRef>("Sequence") && steps)
        for (const llvm::json::Value& v : *steps)
          if (const llvm::json::Object* o = v.getAsObject(); o && !isNfc(o) && o->getString("type"))
            name = "'" + o->getString("type")->str() + "' (in a Sequence)";
      return fail("normalizer " + name + " is not supported (byte-level BPE files: none or NFC)");
    }
  }
  tok.ignoreMerges = model->getBoolean("ignore_merges").value_or(false);

  const llvm::json::Object* vocab = model->getObject("vocab");
  if (!vocab)
    return fail("model.vocab is missing");
  std::map<std::string, int32_t> ids;
  int64_t maxId = -1;
  for (const auto& [token, idValue] : *vocab) {
    auto id = idValue.getAsInteger();
    if (!id || *id < 0 || *id > (1 << 24))
      return fail("model.vocab['" + llvm::StringRef(token) + "'] is not a valid id");
    ids[token.str()] = static_cast<int32_t>(*id);
    maxId = std::max(maxId, *id);
  }
  if (const llvm::json::Array* added = root->getArray("added_tokens")) {
    for (const llvm::json::Value& v : *added) {
      const llvm::json::Object* t = v.getAsObject();
      auto id = t ? t->getInteger("id") : std::nullopt;
      auto content = t ? t->getString("content") : std::nullopt;
      if (!id || !content || *id < 0 || *id > (1 << 24) || content->empty())
        return fail("malformed entry in added_tokens");
      for (llvm::StringRef flag : {"lstrip", "rstrip", "single_word"})
        if (t->getBoolean(flag).value_or(false))
          return fail("added token '" + *content + "' uses " + flag + ", which is not supported");
      tok.added.push_back({static_cast<int32_t>(*id), content->str(),
                           t->getBoolean("special").value_or(false)});
      maxId = std::max(maxId, *id);
    }
  }
  tok.vocab.assign(static_cast<size_t>(maxId + 1), std::string());
  for (const auto& [token, id] : ids) {
    if (!tok.vocab[id].empty())
      return fail("id " + llvm::Twine(id) + " is given to two tokens");
    tok.vocab[id] = token;
  }

  // What the runtime's tokenizer checks when it loads (runtime/src/tokenizer):
  // checked here too, so that kiln-compile refuses what the runtime would refuse.
  if (metaspace) {
    if (auto unk = model->getString("unk_token")) {
      auto it = ids.find(unk->str());
      if (it == ids.end())
        return fail("model.unk_token '" + *unk + "' is not in the vocabulary");
      tok.unkId = it->second;
    }
    if (tok.byteFallback)
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        if (!ids.count(name))
          return fail(llvm::Twine("model.vocab has no byte token ") + name + ": byte_fallback needs all 256");
      }
    if (!tok.byteFallback && tok.unkId < 0)
      return fail("a SentencePiece-style model needs byte_fallback or an unk_token");
    // Decoder: Sequence [Replace(U+2581 -> ' '), ByteFallback, Fuse, Strip(' ', n, 0)] or
    // Metaspace; the leading spaces it strips.
    const llvm::json::Object* dec = root->getObject("decoder");
    auto type = dec ? dec->getString("type") : std::nullopt;
    if (type == std::optional<llvm::StringRef>("Metaspace")) {
      tok.decodeStrip = dec->getString("prepend_scheme") == std::optional<llvm::StringRef>("never") ? 0 : 1;
    } else if (type == std::optional<llvm::StringRef>("Sequence") && dec->getArray("decoders")) {
      for (const llvm::json::Value& v : *dec->getArray("decoders")) {
        const llvm::json::Object* d = v.getAsObject();
        auto t = d ? d->getString("type") : std::nullopt;
        if (t == std::optional<llvm::StringRef>("Strip")) {
          if (d->getString("content") != std::optional<llvm::StringRef>(" ") || d->getInteger("stop").value_or(0) != 0)
            return fail("decoder Strip must strip leading spaces only");
          tok.decodeStrip = static_cast<int>(d->getInteger("start").value_or(0));
        } else if (t == std::optional<llvm::StringRef>("Replace")) {
          const llvm::json::Object* pat = d->getObject("pattern");
          if (!pat || pat->getString("String") != std::optional<llvm::StringRef>(kSpace) ||
              d->getString("content") != std::optional<llvm::StringRef>(" "))
            return fail("decoder Replace must turn U+2581 into ' '");
        } else if (t != std::optional<llvm::StringRef>("ByteFallback") && t != std::optional<llvm::StringRef>("Fuse")) {
          return fail("decoder step '" + (t ? t->str() : std::string("?")) + "' is not supported");
        }
      }
    } else {
      return fail("a SentencePiece-style tokenizer needs a Metaspace or [Replace, ByteFallback, Fuse, Strip] decoder");
    }
    if (tok.decodeStrip < 0 || tok.decodeStrip > 8)
      return fail("decoder Strip start must be in [0, 8]");
  }
  // Every byte needs a token (GPT-2's bytes_to_unicode character): a pre-token can
  // hold any byte.
  if (!metaspace) {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      unsigned cp = printable ? static_cast<unsigned>(b) : 256u + static_cast<unsigned>(extra++);
      std::string utf8;
      if (cp < 0x80) {
        utf8.push_back(static_cast<char>(cp));
      } else {
        utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      if (!ids.count(utf8)) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "%02X", b);
        char ucp[8];
        std::snprintf(ucp, sizeof(ucp), "%04X", cp);
        return fail(llvm::Twine("model.vocab has no token for byte 0x") + hex + " ('" + utf8 +
                    "', U+" + ucp + "): byte-level BPE needs all 256");
      }
    }
  }
  // Added tokens: distinct contents, and an id the vocabulary gives to no other token.
  {
    std::map<std::string, int32_t> seen;
    for (const auto& a : tok.added) {
      auto [it, inserted] = seen.emplace(a.content, a.id);
      if (!inserted)
        return fail("added token '" + a.content + "' is listed twice (ids " +
                    llvm::Twine(it->second) + " and " + llvm::Twine(a.id) + ")");
      const std::string& inVocab = tok.vocab[static_cast<size_t>(a.id)];
      if (!inVocab.empty() && inVocab != a.content)
        return fail("added token '" + a.content + "' has id " + llvm::Twine(a.id) +
                    ", which model.vocab gives to '" + inVocab + "'");
    }
  }

  if (const llvm::json::Array* merges = model->getArray("merges")) {
    for (const llvm::json::Value& m : *merges) {
      std::string left, right;
      if (auto s = m.getAsString()) {
        auto [l, r] = s->split(' ');
        left = l.str();
        right = r.str();
      } else if (const llvm::json::Array* pair = m.getAsArray();
                 pair && pair->size() == 2 && (*pair)[0].getAsString() && (*pair)[1].getAsString()) {
        left = (*pair)[0].getAsString()->str();
        right = (*pair)[1].getAsString()->str();
      } else {
        return fail("malformed merge entry");
      }
      auto l = ids.find(left), r = ids.find(right), res = ids.find(left + right);
      if (l == ids.end() || r == ids.end() || res == ids.end())
        return fail("merge '" + left + " " + right + "' refers to tokens not in the vocabulary");
      tok.merges.push_back({static_cast<uint32_t>(l->second), static_cast<uint32_t>(r->second)});
    }
  }

  // Pre-tokenizer: GPT-2's ByteLevel, or Split(regex) + ByteLevel (Llama-3, Qwen2);
  // SentencePiece-style files were read above.
  const llvm::json::Object* pre = root->getObject("pre_tokenizer");
  if (!metaspace && !pre)
    return fail("pre_tokenizer is missing");
  if (!metaspace) {
    auto checkByteLevel = [&](const llvm::json::Object& bl, bool useRegex) -> std::optional<std::string> {
      if (bl.getBoolean("add_prefix_space").value_or(false))
        return fail("ByteLevel add_prefix_space = true is not supported");
      if (bl.getBoolean("use_regex").value_or(true) != useRegex)
        return fail("unsupported ByteLevel use_regex setting");
      return std::nullopt;
    };
    if (pre->getString("type") == std::optional<llvm::StringRef>("ByteLevel")) {
      if (auto err = checkByteLevel(*pre, true))
        return err;
      tok.pretokenizer = PreTokenizer::Gpt2;
    } else if (pre->getString("type") == std::optional<llvm::StringRef>("Sequence")) {
      const llvm::json::Array* parts = pre->getArray("pretokenizers");
      const llvm::json::Object* split = parts && parts->size() == 2 ? (*parts)[0].getAsObject() : nullptr;
      const llvm::json::Object* bl = parts && parts->size() == 2 ? (*parts)[1].getAsObject() : nullptr;
      if (!split || !bl || split->getString("type") != std::optional<llvm::StringRef>("Split") ||
          bl->getString("type") != std::optional<llvm::StringRef>("ByteLevel"))
        return fail("pre_tokenizer Sequence must be [Split, ByteLevel]");
      const llvm::json::Object* pattern = split->getObject("pattern");
      auto regex = pattern ? pattern->getString("Regex") : std::nullopt;
      if (!regex)
        return fail("Split pre-tokenizer needs a Regex pattern");
      if (split->getString("behavior") != std::optional<llvm::StringRef>("Isolated") ||
          split->getBoolean("invert").value_or(false))
        return fail("Split pre-tokenizer must be behavior Isolated, invert false");
      if (auto err = checkByteLevel(*bl, false))
        return err;
      tok.pretokenizer = PreTokenizer::Split;
      tok.pattern = regex->str();
    } else {
      return fail("unsupported pre_tokenizer type");
    }
  }

  if (const llvm::json::Object* post = root->getObject("post_processor")) {
    auto type = post->getString("type");
    if (type == std::optional<llvm::StringRef>("TemplateProcessing")) {
      readTemplate(*post, tok, ids);
    } else if (type == std::optional<llvm::StringRef>("Sequence")) {
      if (const llvm::json::Array* procs = post->getArray("processors"))
        for (const llvm::json::Value& p : *procs)
          if (const llvm::json::Object* o = p.getAsObject())
            if (o->getString("type") == std::optional<llvm::StringRef>("TemplateProcessing"))
              readTemplate(*o, tok, ids);
    }
    if (tok.addBos) {
      bool known = false;
      for (const auto& a : tok.added)
        known |= a.id == tok.bosId;
      if (!known && (tok.bosId >= static_cast<int32_t>(tok.vocab.size()) || tok.vocab[tok.bosId].empty()))
        return fail("the post-processor's BOS token is not in the vocabulary");
    }
  }
  return std::nullopt;
}

} // namespace kiln
