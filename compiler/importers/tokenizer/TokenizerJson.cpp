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
    return fail("model.type must be \"BPE\" (byte-level BPE tokenizers are supported)");
  if (model->getBoolean("byte_fallback").value_or(false))
    return fail("byte_fallback BPE (SentencePiece style) is not supported");
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
  if (const llvm::json::Value* n = root->get("normalizer"); n && n->kind() != llvm::json::Value::Null) {
    const llvm::json::Object* normalizer = n->getAsObject();
    std::optional<llvm::StringRef> type = normalizer ? normalizer->getString("type") : std::nullopt;
    const llvm::json::Array* steps = normalizer ? normalizer->getArray("normalizers") : nullptr;
    if (!(type == std::optional<llvm::StringRef>("Sequence") && steps && steps->empty()))
      return fail("normalizer " + (type ? "'" + type->str() + "'" : std::string("(no type)")) +
                  " is not supported (byte-level BPE tokenizers have none; an empty Sequence is accepted)");
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
  // Every byte needs a token (GPT-2's bytes_to_unicode character): a pre-token can
  // hold any byte.
  {
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

  // Pre-tokenizer: GPT-2's ByteLevel, or Split(regex) + ByteLevel (Llama-3, Qwen2).
  const llvm::json::Object* pre = root->getObject("pre_tokenizer");
  if (!pre)
    return fail("pre_tokenizer is missing");
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
