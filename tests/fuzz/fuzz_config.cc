// fuzz_config: the compiler's parsers of config.json, generation_config.json and
// preprocessor_config.json (compiler/importers/hf/HFConfig.h).
//
// The input is JSON text. It is parsed in memory (llvm::json::parse) and, when it is
// JSON, given to all three parsers; it is also read from a temporary file through
// readJsonFile, the path the importer takes. Each call must return a value or an
// llvm::Error (consumed); a crash or a sanitizer report is a defect.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

#include "compiler/importers/hf/HFConfig.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

namespace hf = kiln::hf;

namespace {

template <typename T>
void Consume(llvm::Expected<T> v) {
  if (!v) llvm::consumeError(v.takeError());
}

const std::string& TempPath() {
  static std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    std::string p = std::string(dir && *dir ? dir : "/tmp") + "/kiln-fuzz-config-" +
                    std::to_string(getpid()) + ".json";
    std::atexit([] { std::remove(TempPath().c_str()); });
    return p;
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  llvm::StringRef text(reinterpret_cast<const char*>(data), size);
  llvm::Expected<llvm::json::Value> root = llvm::json::parse(text);
  if (!root) {
    llvm::consumeError(root.takeError());
  } else {
    Consume(hf::parseModelConfig(*root, "config.json"));
    Consume(hf::parseGenerationConfig(*root, "generation_config.json"));
    Consume(hf::parsePreprocessorConfig(*root, "preprocessor_config.json"));
  }
  // readJsonFile: the file path of the importer (UTF-8 checks, size limits, errors).
  const std::string& path = TempPath();
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
    Consume(hf::readJsonFile(path, "config.json"));
  }
  return 0;
}
