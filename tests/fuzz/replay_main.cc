// A plain main() for the fuzz targets: replays files (or every file of directories,
// in name order) through LLVMFuzzerTestOneInput, without libFuzzer. Used by the ctest
// fuzz-regressions on tests/fuzz/regressions/<target>/ and tests/fuzz/corpus/<target>/.
// A crash, a sanitizer report or an abort() in the target fails the test.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <dirent.h>
#include <sys/stat.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static bool IsDir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int main(int argc, char** argv) {
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!IsDir(arg)) {
      struct stat st;
      if (stat(arg.c_str(), &st) == 0) files.push_back(arg);
      continue;  // a missing directory is an empty one
    }
    std::vector<std::string> in_dir;
    if (DIR* d = opendir(arg.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string name = e->d_name;
        if (name.empty() || name[0] == '.' || name == "README.md") continue;
        if (!IsDir(arg + "/" + name)) in_dir.push_back(arg + "/" + name);
      }
      closedir(d);
    }
    std::sort(in_dir.begin(), in_dir.end());
    files.insert(files.end(), in_dir.begin(), in_dir.end());
  }
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::printf("replay %s (%zu bytes)\n", f.c_str(), bytes.size());
    std::fflush(stdout);
    // A copy of exactly `size` bytes, so that ASan sees reads past the end.
    uint8_t* copy = new uint8_t[bytes.size() ? bytes.size() : 1];
    std::copy(bytes.begin(), bytes.end(), copy);
    LLVMFuzzerTestOneInput(copy, bytes.size());
    delete[] copy;
  }
  std::printf("%zu inputs replayed\n", files.size());
  return 0;
}
