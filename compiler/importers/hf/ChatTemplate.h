//===- ChatTemplate.h - Chat templates as fixed pieces -----------*- C++ -*-===//
//
// The runtime applies a chat template without a Jinja engine: as fixed text
// between the messages of a conversation. The compiler evaluates the checkpoint's
// Jinja template (Jinja.h) on probe conversations whose contents are sentinels,
// cuts the renders at the sentinels, and keeps
//
//   turn(prev, role, image)  the text between the previous message's content (or
//                            the start: prev = start) and this message's content;
//                            with image, split where the image goes
//   generation prompt        the text after the last (user) message's content
//   trim(role)               whether the template strips the role's content
//
// then renders a set of longer conversations both ways and accepts the pieces only
// when every render agrees byte for byte. A template whose text depends on more
// than the neighbouring roles (a turn count, the position from the end) is
// reported as not representable.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_IMPORTERS_HF_CHATTEMPLATE_H
#define KILN_COMPILER_IMPORTERS_HF_CHATTEMPLATE_H

#include <map>
#include <string>
#include <vector>

namespace kiln::jinja {
class Template;
}

namespace kiln::hf {

enum ChatRole { kSystem = 0, kUser = 1, kAssistant = 2, kRoles = 3 };
constexpr int kChatStart = 3;  // "prev" of the first message

struct ChatTurn {
  bool allowed = false;      // the template accepts this transition
  std::string text;          // before the content (before the image, with one)
  std::string afterImage;    // with an image: between the image and the content
};

struct ChatPieces {
  std::string source;        // "tokenizer_config.json", a file, or "built-in llava"
  std::string jinja;         // the template's text
  bool listContent = false;  // messages carry [{"type": "image"}, {"type": "text", ...}]
  ChatTurn turns[4][kRoles][2];  // [prev: system, user, assistant, start][role][image]
  std::string generationPrompt;  // after the last user message
  bool trimLeft[kRoles] = {}, trimRight[kRoles] = {};
  bool hasImages = false;    // image turns were derived (a model with an image token)

  const ChatTurn& turn(int prev, int role, bool image) const { return turns[prev][role][image ? 1 : 0]; }
};

/// What a template sees besides the messages: bos_token, eos_token, ... (strings).
using ChatVariables = std::map<std::string, std::string>;

struct ChatMessage {
  int role;
  std::string text;
  bool image = false;
};

/// Derives the pieces of `jinja`. `imageToken` is the text the template writes for an
/// image ("<image>"; empty for text-only models: no image turns). On failure returns
/// false with a message in *error (a Jinja error, or why the template is not
/// representable, naming the conversation that differs).
bool deriveChatPieces(const std::string& jinja, const ChatVariables& variables, const std::string& imageToken,
                      ChatPieces* out, std::string* error);

/// Renders `messages` (plus the generation prompt) from the pieces, the image as
/// `imageToken`: what the runtime does, for the check and for tests.
bool renderChatPieces(const ChatPieces& pieces, const std::vector<ChatMessage>& messages,
                      const std::string& imageToken, std::string* out, std::string* error);

/// Renders `messages` with the Jinja template as transformers' apply_chat_template
/// (add_generation_prompt=True). Throws jinja::Error.
std::string renderChatJinja(const std::string& jinja, const ChatVariables& variables,
                            const std::vector<ChatMessage>& messages, bool listContent,
                            const std::string& imageToken, bool addGenerationPrompt = true);
/// The same with the template parsed once (the compiler's probes render it many times).
std::string renderChatJinja(const jinja::Template& parsed, const ChatVariables& variables,
                            const std::vector<ChatMessage>& messages, bool listContent,
                            const std::string& imageToken, bool addGenerationPrompt = true);

/// The built-in templates (the Jinja text of the checkpoints they come from), for
/// checkpoints that ship none: "llava" (llava-hf/llava-1.5), "idefics3" (SmolVLM),
/// "llava-chatml" (ChatML with the image first), "chatml". Empty for unknown names.
std::string builtinChatTemplate(const std::string& name);

} // namespace kiln::hf

#endif // KILN_COMPILER_IMPORTERS_HF_CHATTEMPLATE_H
