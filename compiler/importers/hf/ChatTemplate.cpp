//===- ChatTemplate.cpp - Chat templates as fixed pieces -------------------===//
#include "compiler/importers/hf/ChatTemplate.h"

#include "compiler/importers/hf/Jinja.h"

#include <optional>

namespace kiln::hf {
namespace {

using jinja::Value;

const char* kRoleNames[kRoles] = {"system", "user", "assistant"};
const char* kPad = "\f \f";  // whitespace no template writes around a content itself

std::string sentinel(size_t k) { return "kilnzq" + std::string(1, static_cast<char>('a' + k)) + "zq"; }


std::string describe(const std::vector<ChatMessage>& conv) {
  std::string out = "[";
  for (size_t k = 0; k < conv.size(); ++k)
    out += std::string(k ? ", " : "") + kRoleNames[conv[k].role] + (conv[k].image ? "+image" : "");
  return out + "]";
}

// The first difference of two renders, for the error message.
std::string difference(const std::string& want, const std::string& got) {
  size_t k = 0;
  while (k < want.size() && k < got.size() && want[k] == got[k]) ++k;
  auto show = [&](const std::string& s) {
    std::string part = s.substr(k > 20 ? k - 20 : 0, 60), out;
    for (char c : part) out += c == '\n' ? std::string("\\n") : std::string(1, c);
    return "\"" + out + "\"";
  };
  return "at byte " + std::to_string(k) + ": the template writes " + show(want) + ", the pieces " + show(got);
}

struct Probe {
  std::vector<std::string> parts;           // before each content, then the tail
  std::vector<std::pair<bool, bool>> pads;  // per message: left and right padding kept
};

}  // namespace

std::string renderChatJinja(const std::string& jinja, const ChatVariables& variables,
                            const std::vector<ChatMessage>& messages, bool listContent,
                            const std::string& imageToken, bool addGenerationPrompt) {
  return renderChatJinja(jinja::Template(jinja), variables, messages, listContent, imageToken, addGenerationPrompt);
}

std::string renderChatJinja(const jinja::Template& parsed, const ChatVariables& variables,
                            const std::vector<ChatMessage>& messages, bool listContent,
                            const std::string& imageToken, bool addGenerationPrompt) {
  jinja::List list;
  for (const ChatMessage& m : messages) {
    Value content;
    if (listContent) {
      jinja::List items;
      if (m.image) items.push_back(Value::makeDict({{"type", Value::string("image")}}));
      items.push_back(Value::makeDict({{"type", Value::string("text")}, {"text", Value::string(m.text)}}));
      content = Value::makeList(std::move(items));
    } else {
      content = Value::string((m.image ? imageToken + "\n" : std::string()) + m.text);
    }
    list.push_back(Value::makeDict({{"role", Value::string(kRoleNames[m.role])}, {"content", content}}));
  }
  Value context = Value::makeDict();
  for (const auto& kv : variables) context.set(kv.first, Value::string(kv.second));
  context.set("messages", Value::makeList(std::move(list)));
  context.set("add_generation_prompt", Value::boolean(addGenerationPrompt));
  context.set("tools", Value::none());
  context.set("documents", Value::none());
  return parsed.render(context);
}

bool renderChatPieces(const ChatPieces& p, const std::vector<ChatMessage>& messages, const std::string& imageToken,
                      std::string* out, std::string* error) {
  out->clear();
  if (messages.empty() || messages.back().role != kUser) {
    *error = "the last message must be a user message";
    return false;
  }
  int prev = kChatStart;
  for (const ChatMessage& m : messages) {
    const ChatTurn& t = p.turn(prev, m.role, m.image);
    if (!t.allowed) {
      *error = std::string("the chat template does not accept ") + (m.image ? "an image in " : "") + "a " +
               kRoleNames[m.role] + " message " +
               (prev == kChatStart ? std::string("first") : std::string("after a ") + kRoleNames[prev] + " message");
      return false;
    }
    *out += t.text;
    if (m.image) *out += imageToken + t.afterImage;
    *out += jinja::stripSpace(m.text, p.trimLeft[m.role], p.trimRight[m.role]);
    prev = m.role;
  }
  *out += p.generationPrompt;
  return true;
}

bool deriveChatPieces(const std::string& text, const ChatVariables& variables, const std::string& imageToken,
                      ChatPieces* out, std::string* error) {
  ChatPieces p;
  p.jinja = text;
  std::optional<jinja::Template> parsed;
  try {
    parsed.emplace(text);  // syntax errors first, with their line
  } catch (const jinja::Error& e) {
    *error = e.what();
    return false;
  }
  const jinja::Template& tmpl = *parsed;
  // String or list contents: the one whose render shows the text.
  auto shows = [&](bool list) {
    try {
      return renderChatJinja(tmpl, variables, {{kUser, sentinel(0), false}}, list, imageToken).find(sentinel(0)) !=
             std::string::npos;
    } catch (const jinja::Error&) {
      return false;
    }
  };
  if (shows(false)) {
    p.listContent = false;
  } else if (shows(true)) {
    p.listContent = true;
  } else {
    try {
      renderChatJinja(tmpl, variables, {{kUser, sentinel(0), false}}, false, imageToken);
      *error = "the template does not write the message's content (neither as a string nor as a list of "
               "{\"type\": \"text\"} items)";
    } catch (const jinja::Error& e) {
      *error = std::string("a conversation of one user message: ") + e.what();
    }
    return false;
  }

  // Renders `conv` with padded sentinels and cuts it at them.
  auto probe = [&](const std::vector<ChatMessage>& roles) -> std::optional<Probe> {
    std::vector<ChatMessage> conv = roles;
    for (size_t k = 0; k < conv.size(); ++k) conv[k].text = kPad + sentinel(k) + kPad;
    std::string r;
    try {
      r = renderChatJinja(tmpl, variables, conv, p.listContent, imageToken);
    } catch (const jinja::Error&) {
      return std::nullopt;
    }
    Probe pr;
    size_t pos = 0;
    const std::string pad = kPad;
    for (size_t k = 0; k < conv.size(); ++k) {
      size_t at = r.find(sentinel(k), pos);
      if (at == std::string::npos || r.find(sentinel(k), at + 1) != std::string::npos) return std::nullopt;
      size_t start = at, end = at + sentinel(k).size();
      bool left = at >= pos + pad.size() && r.compare(at - pad.size(), pad.size(), pad) == 0;
      bool right = r.compare(end, pad.size(), pad) == 0;
      if (left) start -= pad.size();
      if (right) end += pad.size();
      pr.parts.push_back(r.substr(pos, start - pos));
      pr.pads.emplace_back(left, right);
      pos = end;
    }
    pr.parts.push_back(r.substr(pos));
    return pr;
  };

  auto first = probe({{kUser, "", false}});
  if (!first) {
    *error = "the template's render of one user message cannot be cut at its content";
    return false;
  }
  p.generationPrompt = first->parts.back();
  p.trimLeft[kUser] = !first->pads[0].first;
  p.trimRight[kUser] = !first->pads[0].second;
  bool trimKnown[kRoles] = {false, true, false};

  p.hasImages = !imageToken.empty();
  // Each transition in the first context the template accepts it in (Gemma refuses a
  // system message first but takes one after a user message).
  const std::vector<std::vector<int>> contexts[4] = {
      {{kSystem}, {kUser, kSystem}},
      {{kUser}, {kSystem, kUser}},
      {{kUser, kAssistant}, {kSystem, kUser, kAssistant}},
      {{}},
  };
  for (int prev : {kChatStart, int(kSystem), int(kUser), int(kAssistant)}) {
    for (int role = 0; role < kRoles; ++role) {
      for (int image = 0; image < (role == kUser && p.hasImages ? 2 : 1); ++image) {
        std::optional<Probe> pr;
        std::vector<ChatMessage> prefix;
        for (const auto& roles : contexts[prev == kChatStart ? 3 : prev]) {
          prefix.clear();
          for (int r : roles) prefix.push_back({r, "", false});
          std::vector<ChatMessage> conv = prefix;
          conv.push_back({role, "", image == 1});
          if (role != kUser) conv.push_back({kUser, "", false});
          if ((pr = probe(conv))) break;
        }
        if (!pr) continue;
        size_t at = prefix.size();
        ChatTurn& t = p.turns[prev][role][image];
        t.text = pr->parts[at];
        if (image) {
          size_t k = t.text.rfind(imageToken);
          if (k == std::string::npos) continue;  // the template drops images: not accepted
          t.afterImage = t.text.substr(k + imageToken.size());
          t.text.erase(k);
        } else if (!trimKnown[role]) {
          p.trimLeft[role] = !pr->pads[at].first;
          p.trimRight[role] = !pr->pads[at].second;
          trimKnown[role] = true;
        }
        t.allowed = true;
      }
    }
  }

  // Every conversation both ways, byte for byte.
  const char* texts[] = {"You are a careful assistant.", "What is in the picture?", "A red valve, 3/4 inch.",
                         " How do I install it?\n", "Turn it clockwise.", "Thanks! And then?"};
  auto m = [](int role, bool image = false) { return ChatMessage{role, "", image}; };
  std::vector<std::vector<ChatMessage>> checks = {
      {m(kUser)},
      {m(kSystem), m(kUser)},
      {m(kUser), m(kAssistant), m(kUser)},
      {m(kSystem), m(kUser), m(kAssistant), m(kUser), m(kAssistant), m(kUser)},
      {m(kUser), m(kAssistant), m(kUser), m(kAssistant), m(kUser)},
  };
  if (p.hasImages) {
    checks.push_back({m(kUser, true)});
    checks.push_back({m(kSystem), m(kUser, true), m(kAssistant), m(kUser)});
    checks.push_back({m(kUser), m(kAssistant), m(kUser, true)});
  }
  for (auto& conv : checks) {
    size_t t = conv.size() % 3;
    for (auto& m : conv) m.text = texts[t++ % 6];
    std::string want, got, why;
    bool jinjaOk = true;
    try {
      want = renderChatJinja(tmpl, variables, conv, p.listContent, imageToken);
    } catch (const jinja::Error& e) {
      jinjaOk = false;
      why = e.what();
    }
    bool piecesOk = renderChatPieces(p, conv, imageToken, &got, &why);
    if (!jinjaOk && !piecesOk) continue;
    if (jinjaOk != piecesOk || want != got) {
      *error = "not representable as fixed text around each message: the conversation " + describe(conv) + " " +
               (jinjaOk != piecesOk ? (jinjaOk ? "renders, but the pieces refuse it (" : "fails (") + why + ")"
                                    : difference(want, got));
      return false;
    }
  }
  *out = std::move(p);
  return true;
}

std::string builtinChatTemplate(const std::string& name) {
  // llava-hf/llava-1.5-7b-hf's chat_template.json.
  if (name == "llava")
    return "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}"
           "{% endif %}{# Render all images first #}{% for content in message['content'] | selectattr('type', "
           "'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != "
           "'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
           "{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', "
           "'equalto', 'text') %}{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}"
           "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";
  // HuggingFaceTB/SmolVLM's (Idefics3Processor's) chat template.
  if (name == "idefics3")
    return "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type']"
           " == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == "
           "'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
           "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";
  // LLaVA with a Qwen2 text model: llava-onevision-qwen2's ChatML template.
  if (name == "llava-chatml")
    return "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}{# Render all images first #}"
           "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}"
           "{% endfor %}{# Render all text next #}{% for content in message['content'] | selectattr('type', "
           "'equalto', 'text') %}{{ content['text'] }}{% endfor %}{{'<|im_end|>' + '\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  // Qwen2-Instruct's ChatML.
  if (name == "chatml")
    return "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>"
           "system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
           "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>"
           "assistant\n' }}{% endif %}";
  return "";
}

} // namespace kiln::hf
