// Text helpers shared by the runtime tools: JSON string escaping, and the compiler's
// label of a stored tensor's encoding (needs the artifact schema, formats/).
#ifndef KILN_TOOLS_COMMON_TEXT_H_
#define KILN_TOOLS_COMMON_TEXT_H_

#include <cstdio>
#include <string>

namespace kiln::tools {

// `s` escaped for a JSON string (quotes, backslashes, control characters; UTF-8 kept).
inline std::string JsonEscape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace kiln::tools

#endif  // KILN_TOOLS_COMMON_TEXT_H_
