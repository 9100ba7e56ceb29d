// The code-segment loader (runtime/src/code/elf_loader.h) on relocatable objects the
// build compiles from code/sample_kernels.c for the target CPU, and on corrupted
// copies of them: every corruption must yield an error status with a message, or an
// image that still answers Find — never a crash or an out-of-bounds read (scripts/test
// runs this suite under AddressSanitizer + UndefinedBehaviorSanitizer, and under qemu
// for aarch64, where the AArch64 relocations of the sample objects are applied and run).
#include <gtest/gtest.h>

#include <elf.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include "code/elf_loader.h"
#include "kiln/kiln.h"

namespace {

using kiln::rt::ApplyRelocation;
using kiln::rt::CodeImage;
using kiln::rt::RelocationName;
using kiln::rt::RelocationWidth;
using kiln::rt::RelocResult;
using Bytes = std::vector<uint8_t>;

const char* const kExports[] = {"kiln_sample_call",   "kiln_sample_square", "kiln_sample_tail", "kiln_sample_affine",
                                "kiln_sample_switch", "kiln_sample_reduce", "kiln_sample_chain"};

#if defined(__x86_64__)
constexpr uint16_t kMachine = EM_X86_64, kOtherMachine = EM_AARCH64;
#else
constexpr uint16_t kMachine = EM_AARCH64, kOtherMachine = EM_X86_64;
#endif

Bytes ReadObject(const char* name) {
  const char* dir = std::getenv("KILN_TEST_CODE_OBJECTS");
#ifdef KILN_DEFAULT_CODE_OBJECTS
  if (dir == nullptr) dir = KILN_DEFAULT_CODE_OBJECTS;
#endif
  std::string path = std::string(dir != nullptr ? dir : ".") + "/" + name;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << "cannot read " << path << " (built with kiln_runtime_tests)";
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// --- Reading and patching the object in place (unaligned: memcpy) ----------------

template <typename T>
T Get(const Bytes& o, uint64_t offset) {
  T v;
  std::memcpy(&v, o.data() + offset, sizeof(T));
  return v;
}
template <typename T>
void Put(Bytes* o, uint64_t offset, const T& v) {
  std::memcpy(o->data() + offset, &v, sizeof(T));
}

Elf64_Ehdr Ehdr(const Bytes& o) { return Get<Elf64_Ehdr>(o, 0); }
uint64_t ShdrOffset(const Bytes& o, int i) { return Ehdr(o).e_shoff + uint64_t(i) * sizeof(Elf64_Shdr); }
Elf64_Shdr Shdr(const Bytes& o, int i) { return Get<Elf64_Shdr>(o, ShdrOffset(o, i)); }
void PutShdr(Bytes* o, int i, const Elf64_Shdr& s) { Put(o, ShdrOffset(*o, i), s); }
std::string SectionName(const Bytes& o, int i) {
  return reinterpret_cast<const char*>(o.data() + Shdr(o, Ehdr(o).e_shstrndx).sh_offset + Shdr(o, i).sh_name);
}
int FindSection(const Bytes& o, const std::string& name) {
  for (int i = 1; i < Ehdr(o).e_shnum; ++i)
    if (SectionName(o, i) == name) return i;
  return -1;
}
int FindSectionOfType(const Bytes& o, uint32_t type) {
  for (int i = 1; i < Ehdr(o).e_shnum; ++i)
    if (Shdr(o, i).sh_type == type) return i;
  return -1;
}
// The first SHT_RELA section that relocates an allocated section (the loader applies it).
int FindLoadedRela(const Bytes& o) {
  for (int i = 1; i < Ehdr(o).e_shnum; ++i) {
    Elf64_Shdr s = Shdr(o, i);
    if (s.sh_type == SHT_RELA && s.sh_size > 0 && (Shdr(o, s.sh_info).sh_flags & SHF_ALLOC)) return i;
  }
  return -1;
}
// Index of the symbol `name`, or -1.
int FindSymbol(const Bytes& o, const char* name) {
  int symtab = FindSectionOfType(o, SHT_SYMTAB);
  Elf64_Shdr st = Shdr(o, symtab), str = Shdr(o, st.sh_link);
  for (uint64_t i = 0; i < st.sh_size / sizeof(Elf64_Sym); ++i) {
    Elf64_Sym s = Get<Elf64_Sym>(o, st.sh_offset + i * sizeof(Elf64_Sym));
    if (std::strcmp(reinterpret_cast<const char*>(o.data() + str.sh_offset + s.st_name), name) == 0)
      return static_cast<int>(i);
  }
  return -1;
}
uint64_t SymOffset(const Bytes& o, int i) {
  return Shdr(o, FindSectionOfType(o, SHT_SYMTAB)).sh_offset + uint64_t(i) * sizeof(Elf64_Sym);
}

// --- Loading ------------------------------------------------------------------------

// Loads `object` from an exactly sized heap copy (so that ASan sees any read past it)
// and returns the status; an error must come with a message.
kiln_status_t TryLoad(CodeImage* image, const uint8_t* data, size_t size, std::string* message = nullptr) {
  Bytes copy(data, data + size);
  kiln_error_t error{};
  kiln_status_t st = image->Load(copy.data(), copy.size(), &error);
  if (st != KILN_OK) {
    EXPECT_EQ(error.status, st);
    EXPECT_GT(std::strlen(error.message), 0u) << "status " << st;
    EXPECT_EQ(image->mapped_bytes(), 0u);
    EXPECT_EQ(image->Find("kiln_sample_call"), nullptr);
  } else {
    EXPECT_GT(image->mapped_bytes(), 0u);
    for (const char* name : kExports) image->Find(name);  // must be answerable; need not be found
    EXPECT_EQ(image->Find("no_such_function"), nullptr);
  }
  if (message != nullptr) *message = st == KILN_OK ? "" : error.message;
  return st;
}

// Loading `object` fails with KILN_ERROR_ARTIFACT_CODE; returns the message.
std::string LoadError(const Bytes& object) {
  CodeImage image;
  std::string message;
  EXPECT_EQ(TryLoad(&image, object.data(), object.size(), &message), KILN_ERROR_ARTIFACT_CODE);
  return message;
}

// --- The sample kernels: their C formulas, and calling them --------------------------

struct Stats {  // struct kiln_sample_stats
  float sum, max;
  int count, argmax;
};

int ScaleAdd(int x, int k) { return x * k + 3; }
int RefCall(int x) { return ScaleAdd(x, 7) + ScaleAdd(x + 1, 5); }
int RefSwitch(int op, int a, int b) {
  switch (op) {
#include "runtime/code/sample_switch.inc"
  }
}

template <typename F>
F Fn(const CodeImage& image, const char* name) {
  void* p = image.Find(name);
  EXPECT_NE(p, nullptr) << name;
  return reinterpret_cast<F>(p);
}

void RunSample(const char* object_name) {
  SCOPED_TRACE(object_name);
  Bytes object = ReadObject(object_name);
  ASSERT_FALSE(object.empty());
  CodeImage image;
  kiln_error_t error{};
  ASSERT_EQ(image.Load(object.data(), object.size(), &error), KILN_OK) << error.message;
  EXPECT_GE(image.mapped_bytes(), 256u);  // the table of squares alone
  for (const char* name : kExports) ASSERT_NE(image.Find(name), nullptr) << name;

  auto call = Fn<int (*)(int)>(image, "kiln_sample_call");
  auto square = Fn<float (*)(int)>(image, "kiln_sample_square");
  auto tail = Fn<int (*)(int)>(image, "kiln_sample_tail");
  auto affine = Fn<double (*)(double)>(image, "kiln_sample_affine");
  auto sw = Fn<int (*)(int, int, int)>(image, "kiln_sample_switch");
  auto reduce = Fn<void (*)(const float*, int, Stats*)>(image, "kiln_sample_reduce");
  auto chain = Fn<int (*)(int)>(image, "kiln_sample_chain");
  for (int x = -20; x <= 20; ++x) {
    EXPECT_EQ(call(x), RefCall(x)) << x;
    EXPECT_EQ(tail(x), ScaleAdd(x, 2)) << x;
    EXPECT_EQ(affine(x * 0.25), x * 0.5 + 0.5) << x;
    EXPECT_EQ(chain(x), RefCall(x) + RefSwitch(x & 7, x, 3) + ((x & 63) * (x & 63))) << x;
  }
  for (int i = 0; i < 128; ++i) EXPECT_EQ(square(i), float((i & 63) * (i & 63))) << i;
  for (int op = -2; op <= 10; ++op)
    for (int a : {-9, -1, 0, 5, 77})
      for (int b : {-4, 0, 3, 12}) EXPECT_EQ(sw(op, a, b), RefSwitch(op, a, b)) << op << " " << a << " " << b;
  const float x[7] = {1.5f, -2.0f, 8.25f, 0.0f, 8.0f, -7.5f, 3.0f};
  Stats stats{0, 0, 0, 0};
  reduce(x, 7, &stats);
  EXPECT_EQ(stats.sum, 11.25f);
  EXPECT_EQ(stats.max, 8.25f);
  EXPECT_EQ(stats.count, 7);
  EXPECT_EQ(stats.argmax, 2);
}

TEST(CodeLoader, LoadsAndRunsSampleKernels) { RunSample("sample.o"); }

TEST(CodeLoader, LoadsUnwindTablesAndTheirRelocations) {
  Bytes object = ReadObject("sample_eh.o");
  ASSERT_FALSE(object.empty());
  int eh = FindSection(object, ".eh_frame");
  ASSERT_GT(eh, 0) << "the object has no .eh_frame";
  EXPECT_TRUE(Shdr(object, eh).sh_flags & SHF_ALLOC);
  EXPECT_GT(FindSection(object, ".rela.eh_frame"), 0);
  RunSample("sample_eh.o");
}

TEST(CodeLoader, FindsOnlyGlobalFunctions) {
  CodeImage empty;
  EXPECT_EQ(empty.Find("kiln_sample_call"), nullptr);
  EXPECT_EQ(empty.mapped_bytes(), 0u);

  Bytes object = ReadObject("sample.o");
  CodeImage image;
  ASSERT_EQ(image.Load(object.data(), object.size(), nullptr), KILN_OK);
  EXPECT_NE(image.Find("kiln_sample_call"), nullptr);
  EXPECT_EQ(image.Find("scale_add"), nullptr);  // static function
  EXPECT_EQ(image.Find("kSquares"), nullptr);   // static data
  EXPECT_EQ(image.Find("kiln_sample"), nullptr);
  EXPECT_EQ(image.Find("kiln_sample_call_"), nullptr);
  EXPECT_EQ(image.Find(""), nullptr);
  EXPECT_EQ(image.Find(nullptr), nullptr);
}

// The perf map (kiln_model_options_t.perf_map) lists every exported function with its
// address (what Find gives) and a size that ends inside the image; writes append.
TEST(CodeLoader, WritesAPerfMapOfTheExports) {
  Bytes object = ReadObject("sample.o");
  CodeImage image;
  ASSERT_EQ(image.Load(object.data(), object.size(), nullptr), KILN_OK);
  char path[] = "/tmp/kiln-perf-map-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  kiln_error_t error;
  ASSERT_EQ(image.WritePerfMap(path, &error), KILN_OK) << error.message;
  ASSERT_EQ(image.WritePerfMap(path, &error), KILN_OK) << error.message;
  std::ifstream in(path);
  std::string line;
  int lines = 0, call = 0;
  while (std::getline(in, line)) {
    unsigned long long at = 0, size = 0;
    char name[256] = {0};
    ASSERT_EQ(std::sscanf(line.c_str(), "%llx %llx %255s", &at, &size, name), 3) << line;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(image.Find(name)), at) << line;
    EXPECT_GT(size, 0u) << line;
    EXPECT_LE(size, image.mapped_bytes()) << line;
    call += std::strcmp(name, "kiln_sample_call") == 0;
    ++lines;
  }
  std::remove(path);
  EXPECT_EQ(call, 2);  // once per write
  EXPECT_EQ(lines % 2, 0);
  EXPECT_EQ(image.WritePerfMap("/nonexistent-dir/perf.map", &error), KILN_ERROR_IO);
  EXPECT_NE(std::strstr(error.message, "/nonexistent-dir/perf.map"), nullptr) << error.message;
}

#if defined(__linux__)
// The image is mapped read+execute, not writable (W^X), according to /proc/self/maps.
TEST(CodeLoader, ImageIsReadExecuteOnly) {
  Bytes object = ReadObject("sample.o");
  CodeImage image;
  ASSERT_EQ(image.Load(object.data(), object.size(), nullptr), KILN_OK);
  const uintptr_t fn = reinterpret_cast<uintptr_t>(image.Find("kiln_sample_call"));
  std::ifstream maps("/proc/self/maps");
  std::string line, perms;
  while (std::getline(maps, line)) {
    unsigned long long begin, end;
    char p[8] = {0};
    if (std::sscanf(line.c_str(), "%llx-%llx %4s", &begin, &end, p) == 3 && fn >= begin && fn < end) perms = p;
  }
  EXPECT_EQ(perms, "r-xp");
}
#endif

TEST(CodeLoader, ReloadReplacesAndFailureLeavesEmpty) {
  Bytes object = ReadObject("sample.o");
  CodeImage image;
  kiln_error_t error{};
  ASSERT_EQ(image.Load(object.data(), object.size(), &error), KILN_OK);
  ASSERT_EQ(image.Load(object.data(), object.size(), &error), KILN_OK);
  EXPECT_EQ(Fn<int (*)(int)>(image, "kiln_sample_call")(4), RefCall(4));
  EXPECT_EQ(image.Load(object.data(), 10, &error), KILN_ERROR_ARTIFACT_CODE);
  EXPECT_EQ(image.mapped_bytes(), 0u);
  EXPECT_EQ(image.Find("kiln_sample_call"), nullptr);
  EXPECT_EQ(image.Load(nullptr, 0, &error), KILN_ERROR_ARTIFACT_CODE);
  ASSERT_EQ(image.Load(object.data(), object.size(), nullptr), KILN_OK);
  EXPECT_EQ(Fn<int (*)(int)>(image, "kiln_sample_call")(-3), RefCall(-3));
}

// --- Objects the loader must refuse ---------------------------------------------------

TEST(CodeLoader, RefusesCallsOutsideTheSegment) {
  std::string m = LoadError(ReadObject("sample_extern.o"));
  EXPECT_NE(m.find("undefined symbol 'external_helper'"), std::string::npos) << m;
  EXPECT_NE(m.find("kernels must not call outside the code segment"), std::string::npos) << m;
}

TEST(CodeLoader, RefusesWritableData) {
  std::string m = LoadError(ReadObject("sample_writable.o"));
  EXPECT_NE(m.find("'.data' is writable"), std::string::npos) << m;
}

TEST(CodeLoader, RefusesAnotherMachine) {
  Bytes object = ReadObject("sample.o");
  Put<uint16_t>(&object, offsetof(Elf64_Ehdr, e_machine), kOtherMachine);
  std::string m = LoadError(object);
  EXPECT_NE(m.find("x86-64"), std::string::npos) << m;
  EXPECT_NE(m.find("AArch64"), std::string::npos) << m;
  Put<uint16_t>(&object, offsetof(Elf64_Ehdr, e_machine), EM_RISCV);
  m = LoadError(object);
  EXPECT_NE(m.find("machine 243"), std::string::npos) << m;
}

TEST(CodeLoader, RefusesRelocationOutsideItsSection) {
  const Bytes original = ReadObject("sample.o");
  const int rela = FindLoadedRela(original);
  ASSERT_GT(rela, 0);
  const Elf64_Shdr rs = Shdr(original, rela);
  const uint64_t size = Shdr(original, rs.sh_info).sh_size;
  const uint64_t at = rs.sh_offset + offsetof(Elf64_Rela, r_offset);
  for (uint64_t offset : {size - 1, size, size + 4096, ~uint64_t{0} - 1}) {
    Bytes object = original;
    Put<uint64_t>(&object, at, offset);
    std::string m = LoadError(object);
    EXPECT_NE(m.find("relocation 0 (R_"), std::string::npos) << m;
    EXPECT_NE(m.find("lies outside section " + std::to_string(rs.sh_info)), std::string::npos) << m;
  }
}

TEST(CodeLoader, RefusesUnknownRelocationTypes) {
  const Bytes original = ReadObject("sample.o");
  const int rela = FindLoadedRela(original);
  ASSERT_GT(rela, 0);
  const uint64_t entry = Shdr(original, rela).sh_offset + sizeof(Elf64_Rela);  // relocation 1
  const uint64_t info = Get<uint64_t>(original, entry + offsetof(Elf64_Rela, r_info));
  // 238: nothing; GOTPCREL / R_AARCH64_ADR_GOT_PAGE: real, but not for kernels.
  for (uint32_t type : {238u, kMachine == EM_X86_64 ? uint32_t{R_X86_64_GOTPCREL} : uint32_t{R_AARCH64_ADR_GOT_PAGE}}) {
    Bytes object = original;
    Put<uint64_t>(&object, entry + offsetof(Elf64_Rela, r_info), ELF64_R_INFO(ELF64_R_SYM(info), type));
    std::string m = LoadError(object);
    EXPECT_NE(m.find("relocation 1 has unsupported type " + std::to_string(type)), std::string::npos) << m;
    EXPECT_NE(m.find(SectionName(original, rela)), std::string::npos) << m;
  }
}

TEST(CodeLoader, RefusesMalformedSectionsAndSymbols) {
  const Bytes original = ReadObject("sample.o");
  const int text = FindSection(original, ".text.kiln_sample_call");
  const int rodata = FindSection(original, ".rodata");
  const int rela = FindLoadedRela(original);
  const int symtab = FindSectionOfType(original, SHT_SYMTAB);
  const int call = FindSymbol(original, "kiln_sample_call");
  ASSERT_GT(text, 0);
  ASSERT_GT(rodata, 0);
  ASSERT_GT(rela, 0);
  ASSERT_GT(call, 0);
  struct Case {
    const char* what;
    void (*corrupt)(Bytes* o, int text, int rodata, int rela, int symtab, int call);
    std::string expected;
  } cases[] = {
      {"alignment above a page",
       [](Bytes* o, int text, int, int, int, int) {
         Elf64_Shdr s = Shdr(*o, text);
         s.sh_addralign = 8192;
         PutShdr(o, text, s);
       },
       "alignment 8192 is not a power of two <= 4096"},
      {"alignment not a power of two",
       [](Bytes* o, int text, int, int, int, int) {
         Elf64_Shdr s = Shdr(*o, text);
         s.sh_addralign = 24;
         PutShdr(o, text, s);
       },
       "alignment 24"},
      {"section past the end",
       [](Bytes* o, int text, int, int, int, int) {
         Elf64_Shdr s = Shdr(*o, text);
         s.sh_offset = ~uint64_t{0} - 8;
         PutShdr(o, text, s);
       },
       "'.text.kiln_sample_call': ["},
      {"writable code",
       [](Bytes* o, int text, int, int, int, int) {
         Elf64_Shdr s = Shdr(*o, text);
         s.sh_flags |= SHF_WRITE;
         PutShdr(o, text, s);
       },
       "'.text.kiln_sample_call' is writable: kernels must not have writable data"},
      {"thread-local data",
       [](Bytes* o, int, int rodata, int, int, int) {
         Elf64_Shdr s = Shdr(*o, rodata);
         s.sh_flags |= SHF_TLS;
         PutShdr(o, rodata, s);
       },
       "'.rodata' is thread-local"},
      {"constructors",
       [](Bytes* o, int, int rodata, int, int, int) {
         Elf64_Shdr s = Shdr(*o, rodata);
         s.sh_type = SHT_INIT_ARRAY;
         PutShdr(o, rodata, s);
       },
       "'.rodata': allocated sections of type 0xe are not supported"},
      {"SHT_REL",
       [](Bytes* o, int, int, int rela, int, int) {
         Elf64_Shdr s = Shdr(*o, rela);
         s.sh_type = SHT_REL;
         PutShdr(o, rela, s);
       },
       "SHT_REL relocations are not supported"},
      {"two symbol tables",
       [](Bytes* o, int, int, int rela, int, int) {
         Elf64_Shdr s = Shdr(*o, rela);
         s.sh_type = SHT_SYMTAB;
         PutShdr(o, rela, s);
       },
       "more than one symbol table"},
      {"no symbol table",
       [](Bytes* o, int, int, int, int symtab, int) {
         Elf64_Shdr s = Shdr(*o, symtab);
         s.sh_type = SHT_PROGBITS;
         PutShdr(o, symtab, s);
       },
       "no symbol table"},
      {"section name outside the name table",
       [](Bytes* o, int text, int, int, int, int) {
         Elf64_Shdr s = Shdr(*o, text);
         s.sh_name = 0x7FFFFFFF;
         PutShdr(o, text, s);
       },
       "name offset 2147483647 lies outside the section name table"},
      {"string table without its final NUL",
       [](Bytes* o, int, int, int, int symtab, int) {
         Elf64_Shdr str = Shdr(*o, Shdr(*o, symtab).sh_link);
         (*o)[str.sh_offset + str.sh_size - 1] = 'x';
       },
       "lies outside the"},  // the last name of one of the two tables runs off its end
      {"common symbol",
       [](Bytes* o, int, int, int, int, int call) {
         Elf64_Sym s = Get<Elf64_Sym>(*o, SymOffset(*o, call));
         s.st_shndx = SHN_COMMON;
         Put(o, SymOffset(*o, call), s);
       },
       "symbol " + std::to_string(call) + " 'kiln_sample_call' is a common symbol"},
      {"symbol section out of range",
       [](Bytes* o, int, int, int, int, int call) {
         Elf64_Sym s = Get<Elf64_Sym>(*o, SymOffset(*o, call));
         s.st_shndx = 5000;
         Put(o, SymOffset(*o, call), s);
       },
       "'kiln_sample_call': section index 5000 out of range"},
      {"symbol outside its section",
       [](Bytes* o, int, int, int, int, int call) {
         Elf64_Sym s = Get<Elf64_Sym>(*o, SymOffset(*o, call));
         s.st_size = ~uint64_t{0};
         Put(o, SymOffset(*o, call), s);
       },
       "'kiln_sample_call' [0, +18446744073709551615) lies outside its section"},
      {"function in data",
       [](Bytes* o, int, int rodata, int, int, int call) {
         Elf64_Sym s = Get<Elf64_Sym>(*o, SymOffset(*o, call));
         s.st_shndx = static_cast<uint16_t>(rodata);
         Put(o, SymOffset(*o, call), s);
       },
       "function 'kiln_sample_call' lies in section"},
      {"IFUNC",
       [](Bytes* o, int, int, int, int, int call) {
         Elf64_Sym s = Get<Elf64_Sym>(*o, SymOffset(*o, call));
         s.st_info = ELF64_ST_INFO(STB_GLOBAL, STT_GNU_IFUNC);
         Put(o, SymOffset(*o, call), s);
       },
       "'kiln_sample_call' is an IFUNC"},
      {"relocation symbol out of range",
       [](Bytes* o, int, int, int rela, int, int) {
         const uint64_t at = Shdr(*o, rela).sh_offset + offsetof(Elf64_Rela, r_info);
         Put<uint64_t>(o, at, ELF64_R_INFO(1000000, ELF64_R_TYPE(Get<uint64_t>(*o, at))));
       },
       "symbol index 1000000 out of range"},
      {"huge NOBITS section",
       [](Bytes* o, int, int rodata, int, int, int) {
         Elf64_Shdr s = Shdr(*o, rodata);
         s.sh_type = SHT_NOBITS;
         s.sh_size = uint64_t{1} << 40;
         PutShdr(o, rodata, s);
       },
       "the image exceeds"},
      {"section header table past the end",
       [](Bytes* o, int, int, int, int, int) {
         Put<uint16_t>(o, offsetof(Elf64_Ehdr, e_shnum), 0xFEFF);
       },
       "section header table (65279 entries"},
      {"bad section name table index",
       [](Bytes* o, int, int, int, int, int) {
         Put<uint16_t>(o, offsetof(Elf64_Ehdr, e_shstrndx), SHN_XINDEX);
       },
       "section name table index 65535 out of range"},
      {"shared object",
       [](Bytes* o, int, int, int, int, int) { Put<uint16_t>(o, offsetof(Elf64_Ehdr, e_type), ET_DYN); },
       "only relocatable objects"},
      {"big-endian",
       [](Bytes* o, int, int, int, int, int) { (*o)[EI_DATA] = ELFDATA2MSB; },
       "only little-endian"},
      {"32-bit",
       [](Bytes* o, int, int, int, int, int) { (*o)[EI_CLASS] = ELFCLASS32; },
       "only ELFCLASS64"},
      {"not ELF",
       [](Bytes* o, int, int, int, int, int) { (*o)[1] = 'X'; },
       "no ELF magic"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Bytes object = original;
    c.corrupt(&object, text, rodata, rela, symtab, call);
    std::string m = LoadError(object);
    EXPECT_NE(m.find(c.expected), std::string::npos) << m;
    EXPECT_EQ(m.rfind("code segment: ", 0), 0u) << m;
  }
}

// --- Corruption sweeps: an error or a usable image, never a crash ----------------------

TEST(CodeLoader, TruncatedObjectsFail) {
  for (const char* name : {"sample.o", "sample_eh.o"}) {
    const Bytes object = ReadObject(name);
    ASSERT_FALSE(object.empty());
    CodeImage image;
    for (size_t len = 0; len < object.size(); ++len) {
      // Clang writes the section headers last, so each cut loses some of them.
      EXPECT_NE(TryLoad(&image, object.data(), len), KILN_OK) << name << " cut at " << len;
    }
  }
}

// XORs each byte of [begin, end) with each mask; returns how many loads failed.
int FlipSweep(const Bytes& original, uint64_t begin, uint64_t end, std::initializer_list<uint8_t> masks) {
  int failed = 0;
  CodeImage image;
  Bytes object = original;
  for (uint64_t i = begin; i < end && i < object.size(); ++i) {
    for (uint8_t mask : masks) {
      object[i] ^= mask;
      if (TryLoad(&image, object.data(), object.size()) != KILN_OK) ++failed;
      object[i] ^= mask;
    }
  }
  return failed;
}

TEST(CodeLoader, BitFlipsInHeadersNeverCrash) {
  for (const char* name : {"sample.o", "sample_eh.o"}) {
    SCOPED_TRACE(name);
    const Bytes object = ReadObject(name);
    ASSERT_FALSE(object.empty());
    const Elf64_Ehdr eh = Ehdr(object);
    EXPECT_GT(FlipSweep(object, 0, sizeof(Elf64_Ehdr), {0x01, 0x02, 0x10, 0x80, 0xFF}), 0);
    EXPECT_GT(FlipSweep(object, eh.e_shoff, eh.e_shoff + uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr),
                        {0x01, 0x04, 0x20, 0x80, 0xFF}),
              0);
  }
}

TEST(CodeLoader, BitFlipsInSymbolsAndRelocationsNeverCrash) {
  for (const char* name : {"sample.o", "sample_eh.o"}) {
    SCOPED_TRACE(name);
    const Bytes object = ReadObject(name);
    ASSERT_FALSE(object.empty());
    for (int i = 1; i < Ehdr(object).e_shnum; ++i) {
      const Elf64_Shdr s = Shdr(object, i);
      if (s.sh_type != SHT_SYMTAB && s.sh_type != SHT_RELA) continue;
      SCOPED_TRACE(SectionName(object, i));
      FlipSweep(object, s.sh_offset, s.sh_offset + s.sh_size, {0x01, 0x08, 0x80, 0xFF});
    }
  }
}

// --- Relocation arithmetic of both machines, whatever the host ---------------------------

uint32_t Patched(uint16_t machine, uint32_t type, uint64_t p, uint64_t sa, uint32_t insn,
                 RelocResult expected = RelocResult::kOk) {
  uint8_t loc[4];
  std::memcpy(loc, &insn, 4);  // the hosts are little-endian, as the objects
  EXPECT_EQ(ApplyRelocation(machine, type, p, sa, loc), expected)
      << "type " << type << " P=" << p << " S+A=" << sa;
  uint32_t out;
  std::memcpy(&out, loc, 4);
  return out;
}

uint64_t Patched64(uint16_t machine, uint32_t type, uint64_t p, uint64_t sa) {
  uint8_t loc[8] = {0};
  EXPECT_EQ(ApplyRelocation(machine, type, p, sa, loc), RelocResult::kOk);
  uint64_t out;
  std::memcpy(&out, loc, 8);
  return out;
}

TEST(CodeLoader, RelocationArithmeticX86_64) {
  constexpr uint16_t m = EM_X86_64;
  constexpr auto kOverflow = RelocResult::kOverflow;
  EXPECT_EQ(Patched(m, R_X86_64_PC32, 0x1000, 0x2000, 0), 0x1000u);
  EXPECT_EQ(Patched(m, R_X86_64_PLT32, 0x2000, 0x1000, 0), 0xFFFFF000u);
  EXPECT_EQ(Patched(m, R_X86_64_PC32, 0x1000, 0x1000 + 0x7FFFFFFFull, 0), 0x7FFFFFFFu);
  Patched(m, R_X86_64_PC32, 0x1000, 0x1000 + 0x80000000ull, 0, kOverflow);
  EXPECT_EQ(Patched(m, R_X86_64_PC32, 0x80001000ull, 0x1000, 0), 0x80000000u);
  Patched(m, R_X86_64_PC32, 0x80001001ull, 0x1000, 0, kOverflow);
  EXPECT_EQ(Patched(m, R_X86_64_32, 0, 0xFFFFFFFFull, 0), 0xFFFFFFFFu);
  Patched(m, R_X86_64_32, 0, 0x100000000ull, 0, kOverflow);
  EXPECT_EQ(Patched(m, R_X86_64_32S, 0, 0xFFFFFFFF80000000ull, 0), 0x80000000u);
  Patched(m, R_X86_64_32S, 0, 0x80000000ull, 0, kOverflow);
  Patched(m, R_X86_64_32S, 0, 0x7FFF00001234ull, 0, kOverflow);  // a typical mmap address
  EXPECT_EQ(Patched64(m, R_X86_64_64, 0x10, 0x123456789ABCDEF0ull), 0x123456789ABCDEF0ull);
  EXPECT_EQ(Patched64(m, R_X86_64_PC64, 0x10, 0x8), ~uint64_t{0} - 7);
  EXPECT_EQ(Patched(m, R_X86_64_NONE, 0, 0, 0xDEADBEEF), 0xDEADBEEFu);
  EXPECT_EQ(RelocationWidth(m, R_X86_64_NONE), 0u);
  EXPECT_EQ(RelocationWidth(m, R_X86_64_PC32), 4u);
  EXPECT_EQ(RelocationWidth(m, R_X86_64_64), 8u);
  EXPECT_STREQ(RelocationName(m, R_X86_64_PLT32), "R_X86_64_PLT32");
  EXPECT_EQ(RelocationName(m, R_X86_64_GOTPCREL), nullptr);
  EXPECT_EQ(RelocationName(m, R_X86_64_TPOFF32), nullptr);
  EXPECT_EQ(Patched(m, R_X86_64_GOTPCRELX, 0, 0, 7, RelocResult::kUnsupported), 7u);
}

// Expected encodings from llvm-mc / ld.lld.
TEST(CodeLoader, RelocationArithmeticAArch64) {
  constexpr uint16_t m = EM_AARCH64;
  constexpr auto kOverflow = RelocResult::kOverflow, kMisaligned = RelocResult::kMisaligned;
  // bl / b: +-128 MiB.
  EXPECT_EQ(Patched(m, R_AARCH64_CALL26, 0x10000, 0x10400, 0x94000000), 0x94000100u);
  EXPECT_EQ(Patched(m, R_AARCH64_CALL26, 0x10000, 0xFFFC, 0x94000000), 0x97FFFFFFu);
  EXPECT_EQ(Patched(m, R_AARCH64_JUMP26, 0x10000, 0x10400, 0x14000000), 0x14000100u);
  Patched(m, R_AARCH64_CALL26, 0x10000000, 0x10000000 + (1 << 27) - 4, 0x94000000);
  Patched(m, R_AARCH64_CALL26, 0x10000000, 0x10000000 - (1 << 27), 0x94000000);
  EXPECT_EQ(Patched(m, R_AARCH64_CALL26, 0x10000000, 0x10000000 + (1 << 27), 0x94000000, kOverflow),
            0x94000000u);
  Patched(m, R_AARCH64_CALL26, 0x10000000, 0x10000000 - (1 << 27) - 4, 0x94000000, kOverflow);
  Patched(m, R_AARCH64_JUMP26, 0x10000, 0x10002, 0x14000000, kMisaligned);
  // b.cond: +-1 MiB; tbz: +-32 KiB.
  EXPECT_EQ(Patched(m, R_AARCH64_CONDBR19, 0x10000, 0x10040, 0x54000000), 0x54000200u);
  Patched(m, R_AARCH64_CONDBR19, 0x200000, 0x200000 - (1 << 20), 0x54000000);
  Patched(m, R_AARCH64_CONDBR19, 0x200000, 0x200000 + (1 << 20), 0x54000000, kOverflow);
  EXPECT_EQ(Patched(m, R_AARCH64_TSTBR14, 0x10000, 0x10040, 0x36000000), 0x36000200u);
  Patched(m, R_AARCH64_TSTBR14, 0x10000, 0x10000 - 0x8000, 0x36000000);
  Patched(m, R_AARCH64_TSTBR14, 0x10000, 0x10000 + 0x8000, 0x36000000, kOverflow);
  // adr: +-1 MiB; adrp: +-4 GiB.
  EXPECT_EQ(Patched(m, R_AARCH64_ADR_PREL_LO21, 0x4020, 0x4020 + 0x12345, 0x10000000), 0x30091A20u);
  Patched(m, R_AARCH64_ADR_PREL_LO21, 0x200000, 0x200000 + (1 << 20), 0x10000000, kOverflow);
  EXPECT_EQ(Patched(m, R_AARCH64_ADR_PREL_PG_HI21, 0x1000, 0x12346678, 0x90000000), 0xB0091A20u);
  EXPECT_EQ(Patched(m, R_AARCH64_ADR_PREL_PG_HI21, 0x5000, 0x1000, 0x90000000), 0x90FFFFE0u);
  Patched(m, R_AARCH64_ADR_PREL_PG_HI21, 0x1000, 0x1000 + (uint64_t{1} << 32), 0x90000000, kOverflow);
  Patched(m, R_AARCH64_ADR_PREL_PG_HI21_NC, 0x1000, 0x1000 + (uint64_t{1} << 32), 0x90000000);
  // Low 12 bits: add, and loads scaled by their size.
  EXPECT_EQ(Patched(m, R_AARCH64_ADD_ABS_LO12_NC, 0, 0x12345678, 0x91000000), 0x9119E000u);
  EXPECT_EQ(Patched(m, R_AARCH64_LDST32_ABS_LO12_NC, 0, 0x12345678, 0xBD400100), 0xBD467900u);
  EXPECT_EQ(Patched(m, R_AARCH64_LDST64_ABS_LO12_NC, 0, 0x12345678, 0xFD400100), 0xFD433D00u);
  EXPECT_EQ(Patched(m, R_AARCH64_LDST8_ABS_LO12_NC, 0, 0xFFF, 0x39400000), 0x397FFC00u);
  EXPECT_EQ(Patched(m, R_AARCH64_LDST16_ABS_LO12_NC, 0, 0x2, 0x79400000), 0x79400400u);
  EXPECT_EQ(Patched(m, R_AARCH64_LDST128_ABS_LO12_NC, 0, 0x10, 0x3DC00000), 0x3DC00400u);
  Patched(m, R_AARCH64_LDST128_ABS_LO12_NC, 0, 0x12345678, 0x3DC00000, kMisaligned);
  Patched(m, R_AARCH64_LDST32_ABS_LO12_NC, 0, 0x12345679, 0xBD400100, kMisaligned);
  // Data.
  EXPECT_EQ(Patched(m, R_AARCH64_PREL32, 0x2000, 0x1000, 0), 0xFFFFF000u);
  EXPECT_EQ(Patched(m, R_AARCH64_PREL32, 0, 0xFFFFFFFFull, 0), 0xFFFFFFFFu);  // -2^31 <= X < 2^32
  Patched(m, R_AARCH64_PREL32, 0, 0x100000000ull, 0, kOverflow);
  Patched(m, R_AARCH64_PREL32, 0x80000001ull, 0, 0, kOverflow);
  EXPECT_EQ(Patched64(m, R_AARCH64_ABS64, 0x10, 0x123456789ABCDEF0ull), 0x123456789ABCDEF0ull);
  EXPECT_EQ(Patched64(m, R_AARCH64_PREL64, 0x10, 0x8), ~uint64_t{0} - 7);
  EXPECT_EQ(RelocationWidth(m, R_AARCH64_NONE), 0u);
  EXPECT_EQ(RelocationWidth(m, R_AARCH64_CALL26), 4u);
  EXPECT_EQ(RelocationWidth(m, R_AARCH64_PREL64), 8u);
  EXPECT_STREQ(RelocationName(m, R_AARCH64_ADR_PREL_PG_HI21), "R_AARCH64_ADR_PREL_PG_HI21");
  EXPECT_EQ(RelocationName(m, R_AARCH64_ADR_GOT_PAGE), nullptr);
  EXPECT_EQ(RelocationName(m, R_X86_64_PC32), nullptr);  // 2 is not an AArch64 type
  EXPECT_EQ(RelocationName(EM_RISCV, 1), nullptr);
}

}  // namespace
