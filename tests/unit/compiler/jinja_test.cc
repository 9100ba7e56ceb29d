// The Jinja subset (compiler/importers/hf/Jinja.h) and the chat pieces
// (ChatTemplate.h) against Jinja2's renders of real chat templates.
#include "compiler/importers/hf/ChatTemplate.h"
#include "compiler/importers/hf/Jinja.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "llvm/Support/JSON.h"

namespace {

using namespace kiln::hf;

std::string readFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Case {
  std::vector<ChatMessage> messages;
  bool addGenerationPrompt;
  bool hasExpected;
  std::string expected, error;
};

struct Golden {
  std::string name, source, imageToken;
  bool listContent, representable;
  ChatVariables variables;
  std::vector<Case> cases;
};

std::vector<Golden> loadGoldens() {
  auto parsed = llvm::json::parse(readFile(KILN_CHAT_GOLDENS));
  if (!parsed) {
    ADD_FAILURE() << "chat_template_goldens.json: " << llvm::toString(parsed.takeError());
    return {};
  }
  std::vector<Golden> out;
  for (const llvm::json::Value& t : *parsed->getAsArray()) {
    const llvm::json::Object& o = *t.getAsObject();
    Golden g;
    g.name = o.getString("name")->str();
    g.source = readFile(std::string(KILN_CHAT_TEMPLATES) + "/" + g.name + ".jinja");
    g.imageToken = o.getString("image_token")->str();
    g.listContent = *o.getBoolean("list_content");
    g.representable = *o.getBoolean("representable");
    for (const auto& kv : *o.getObject("variables")) g.variables[kv.first.str()] = kv.second.getAsString()->str();
    for (const llvm::json::Value& c : *o.getArray("cases")) {
      const llvm::json::Object& co = *c.getAsObject();
      Case k;
      for (const llvm::json::Value& m : *co.getArray("messages")) {
        const llvm::json::Object& mo = *m.getAsObject();
        llvm::StringRef role = *mo.getString("role");
        k.messages.push_back({role == "system" ? kSystem : role == "user" ? kUser : kAssistant,
                              mo.getString("text")->str(), *mo.getBoolean("image")});
      }
      k.addGenerationPrompt = *co.getBoolean("add_generation_prompt");
      k.hasExpected = co.getString("expected").has_value();
      if (k.hasExpected) k.expected = co.getString("expected")->str();
      else k.error = co.getString("error")->str();
      g.cases.push_back(std::move(k));
    }
    out.push_back(std::move(g));
  }
  return out;
}

TEST(Jinja, RendersAsJinja2) {
  auto goldens = loadGoldens();
  ASSERT_GE(goldens.size(), 11u);
  size_t checked = 0;
  for (const Golden& g : goldens) {
    for (size_t k = 0; k < g.cases.size(); ++k) {
      const Case& c = g.cases[k];
      SCOPED_TRACE(g.name + " case " + std::to_string(k));
      try {
        std::string got =
            renderChatJinja(g.source, g.variables, c.messages, g.listContent, g.imageToken, c.addGenerationPrompt);
        EXPECT_TRUE(c.hasExpected) << "rendered, but Jinja2 raised: " << c.error;
        EXPECT_EQ(got, c.expected);
      } catch (const kiln::jinja::RaisedError& e) {
        EXPECT_FALSE(c.hasExpected) << "raised " << e.what();
        EXPECT_EQ(std::string(e.what()), c.error);
      } catch (const kiln::jinja::Error& e) {
        ADD_FAILURE() << e.what();
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 180u);
}

TEST(ChatPieces, ReproduceRepresentableTemplates) {
  for (const Golden& g : loadGoldens()) {
    SCOPED_TRACE(g.name);
    ChatPieces p;
    std::string error;
    bool ok = deriveChatPieces(g.source, g.variables, g.imageToken, &p, &error);
    if (!g.representable) {
      EXPECT_FALSE(ok) << "derived pieces of a template that counts turns or writes no content";
      if (g.name == "whitespace") EXPECT_NE(error.find("not representable"), std::string::npos) << error;
      continue;
    }
    ASSERT_TRUE(ok) << error;
    EXPECT_EQ(p.listContent, g.listContent);
    for (size_t k = 0; k < g.cases.size(); ++k) {
      const Case& c = g.cases[k];
      if (!c.addGenerationPrompt || c.messages.back().role != kUser) continue;
      SCOPED_TRACE("case " + std::to_string(k));
      std::string got, why;
      bool rendered = renderChatPieces(p, c.messages, g.imageToken, &got, &why);
      EXPECT_EQ(rendered, c.hasExpected) << why;
      if (rendered && c.hasExpected) EXPECT_EQ(got, c.expected);
    }
  }
}

TEST(ChatPieces, KnownPieces) {
  auto goldens = loadGoldens();
  auto find = [&](const std::string& name) -> const Golden& {
    for (const Golden& g : goldens)
      if (g.name == name) return g;
    throw std::runtime_error(name);
  };
  ChatPieces p;
  std::string error;
  const Golden& llama = find("llama3-instruct");
  ASSERT_TRUE(deriveChatPieces(llama.source, llama.variables, "", &p, &error)) << error;
  EXPECT_EQ(p.turn(kChatStart, kUser, false).text, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n");
  EXPECT_EQ(p.generationPrompt, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_TRUE(p.trimLeft[kUser] && p.trimRight[kUser]);  // "| trim"
  const Golden& qwen = find("qwen2-instruct");
  ASSERT_TRUE(deriveChatPieces(qwen.source, qwen.variables, "", &p, &error)) << error;
  EXPECT_EQ(p.turn(kChatStart, kUser, false).text,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n");
  EXPECT_EQ(p.turn(kChatStart, kSystem, false).text, "<|im_start|>system\n");
  EXPECT_FALSE(p.trimLeft[kUser]);
  const Golden& smol = find("smolvlm");
  ASSERT_TRUE(deriveChatPieces(smol.source, smol.variables, "<image>", &p, &error)) << error;
  EXPECT_EQ(p.turn(kChatStart, kUser, true).text, "<|im_start|>User:");
  EXPECT_EQ(p.turn(kChatStart, kUser, false).text, "<|im_start|>User: ");
  const Golden& mistral = find("mistral");
  ASSERT_TRUE(deriveChatPieces(mistral.source, mistral.variables, "", &p, &error)) << error;
  EXPECT_FALSE(p.turn(kChatStart, kSystem, false).allowed);  // raise_exception
  EXPECT_FALSE(p.turn(kUser, kUser, false).allowed);
  EXPECT_TRUE(p.turn(kAssistant, kUser, false).allowed);
}

TEST(ChatPieces, BuiltinsAreTheCheckpointsTemplates) {
  EXPECT_EQ(builtinChatTemplate("llava"), readFile(std::string(KILN_CHAT_TEMPLATES) + "/llava-1.5.jinja"));
  EXPECT_EQ(builtinChatTemplate("idefics3"), readFile(std::string(KILN_CHAT_TEMPLATES) + "/smolvlm.jinja"));
  EXPECT_EQ(builtinChatTemplate("chatml"), readFile(std::string(KILN_CHAT_TEMPLATES) + "/qwen2-instruct.jinja"));
  EXPECT_EQ(builtinChatTemplate("no-such"), "");
}

TEST(Jinja, ErrorsNameTheLine) {
  auto message = [](const std::string& src) {
    try {
      kiln::jinja::Template t(src);
      t.render(kiln::jinja::Value::makeDict());
    } catch (const kiln::jinja::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("a\n{% if x %}\nb"), "line 2: this block has no '{% endif %}'");
  EXPECT_EQ(message("{% macro m() %}{% endmacro %}"), "line 1: '{% macro %}' is not supported in chat templates");
  EXPECT_EQ(message("x\n\n{{ 1 + }}"), "line 3: unexpected end of expression");
  EXPECT_EQ(message("{{ x.y }}"), "line 1: 'y' of an undefined value");
  EXPECT_EQ(message("{{ 'a' | nope }}"), "line 1: no filter named 'nope'");
  EXPECT_EQ(message("{{ 'abc"), "line 1: unclosed '{{'");
}

}  // namespace
