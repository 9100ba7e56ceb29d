// fuzz_safetensors: the compiler's safetensors reader
// (compiler/importers/safetensors/Safetensors.h): single files, header JSON in memory,
// and checkpoint directories with model.safetensors.index.json.
//
// The input is one or more files, separated by a line "\n@@file NAME\n" (NAME:
// [A-Za-z0-9._-], at most 64 characters; others are mangled). The first part is
// model.safetensors.index.json when it starts with '{', else model.safetensors. The
// files are written to a temporary directory (one per process, emptied per input), then:
//   - readHeader on every part that is not JSON (a safetensors file);
//   - parseHeader on every JSON part, as a header with a few data bytes;
//   - openCheckpoint on the directory.
// Every call must return a value or an llvm::Error (which is consumed); a crash or a
// sanitizer report is a defect.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "compiler/importers/safetensors/Safetensors.h"
#include "llvm/Support/Error.h"

namespace st = kiln::safetensors;

namespace {

const std::string& TempDir() {
  static std::string dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/kiln-fuzz-safetensors-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back(0);
    if (mkdtemp(buf.data()) == nullptr) std::abort();
    return std::string(buf.data());
  }();
  return dir;
}

std::vector<std::string> g_written;

void Cleanup() {
  for (const std::string& p : g_written) unlink(p.c_str());
  g_written.clear();
}

void AtExit() {
  Cleanup();
  rmdir(TempDir().c_str());
}

std::string SafeName(std::string name) {
  if (name.size() > 64) name.resize(64);
  for (char& c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      c = '_';
  if (name.empty() || name[0] == '.') name.insert(0, "f");
  return name;
}

template <typename T>
void Consume(llvm::Expected<T> v) {
  if (!v) llvm::consumeError(v.takeError());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool registered = (std::atexit(AtExit), true);
  (void)registered;
  std::string input(reinterpret_cast<const char*>(data), size);
  static const std::string kSep = "\n@@file ";
  std::vector<std::pair<std::string, std::string>> files;  // name, contents
  size_t pos = input.find(kSep);
  std::string first = input.substr(0, pos);
  files.push_back({!first.empty() && first[0] == '{' ? "model.safetensors.index.json" : "model.safetensors",
                   first});
  while (pos != std::string::npos && files.size() < 16) {
    size_t name_start = pos + kSep.size();
    size_t name_end = input.find('\n', name_start);
    if (name_end == std::string::npos) break;
    size_t next = input.find(kSep, name_end + 1);
    std::string name = SafeName(input.substr(name_start, name_end - name_start));
    std::string body = input.substr(name_end + 1, next == std::string::npos ? std::string::npos : next - name_end - 1);
    files.push_back({name, body});
    pos = next;
  }

  const std::string& dir = TempDir();
  for (auto& [name, body] : files) {
    std::string path = dir + "/" + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) continue;
    if (!body.empty()) std::fwrite(body.data(), 1, body.size(), f);
    std::fclose(f);
    g_written.push_back(path);
  }

  for (auto& [name, body] : files) {
    if (!body.empty() && body[0] == '{') {
      Consume(st::parseHeader(body, 8 + body.size(), 256, name));
    } else {
      Consume(st::readHeader(dir + "/" + name, name));
    }
  }
  Consume(st::openCheckpoint(dir));
  Cleanup();
  return 0;
}
