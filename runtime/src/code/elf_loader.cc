#include "code/elf_loader.h"

#include <elf.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "platform/platform.h"
#include "support/allocator.h"
#include "support/error.h"
#include "support/sort.h"
#include "support/vec.h"

namespace kiln::rt {
namespace {

constexpr uint32_t kShtX86_64Unwind = 0x70000001;  // SHT_X86_64_UNWIND: x86-64 .eh_frame
constexpr uint64_t kMaxAlignment = 4096;           // the mapping is page-aligned
constexpr uint64_t kMaxImageBytes = uint64_t{1} << 30;
constexpr uint64_t kNotLoaded = ~uint64_t{0};
// Zero bytes before the first section: clang's -fsanitize=function (in the sanitizer
// builds' -fsanitize=undefined) reads 8 bytes before the target of an indirect call,
// looking for a type signature, so no function may start the mapping.
constexpr uint64_t kPrefixBytes = 16;

#if defined(__x86_64__)
constexpr uint16_t kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kHostMachine = EM_AARCH64;
#else
constexpr uint16_t kHostMachine = EM_NONE;
#endif

const char* MachineName(uint16_t machine) {
  switch (machine) {
    case EM_X86_64: return "x86-64";
    case EM_AARCH64: return "AArch64";
    default: return "a CPU without a code loader";
  }
}

using ull = unsigned long long;

// Whether [offset, offset + size) lies within [0, limit), without overflow.
bool InRange(uint64_t offset, uint64_t size, uint64_t limit) {
  uint64_t end;
  return !__builtin_add_overflow(offset, size, &end) && end <= limit;
}

bool FitsSigned(int64_t v, int bits) {
  return v >= -(int64_t{1} << (bits - 1)) && v < (int64_t{1} << (bits - 1));
}

// Little-endian field access (byte-wise: `loc` has no alignment).
uint32_t Read32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
void Write32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Write64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Replaces the bits `mask` of the instruction at p by `bits` (already shifted).
void Patch(uint8_t* p, uint32_t mask, uint32_t bits) { Write32(p, (Read32(p) & ~mask) | (bits & mask)); }

// ADR/ADRP immediate: 21 bits, immlo in [30:29], immhi in [23:5].
void PatchAdr(uint8_t* p, uint64_t imm) {
  Patch(p, 0x60FFFFE0u, static_cast<uint32_t>((imm & 3) << 29 | ((imm >> 2) & 0x7FFFF) << 5));
}

RelocResult ApplyX86_64(uint32_t type, uint64_t p, uint64_t sa, uint8_t* loc) {
  const int64_t rel = static_cast<int64_t>(sa - p);
  switch (type) {
    case R_X86_64_NONE: return RelocResult::kOk;
    case R_X86_64_64: Write64(loc, sa); return RelocResult::kOk;
    case R_X86_64_PC64: Write64(loc, sa - p); return RelocResult::kOk;
    case R_X86_64_PC32:
    case R_X86_64_PLT32:  // every target is in the image: no PLT, the call goes direct
      if (!FitsSigned(rel, 32)) return RelocResult::kOverflow;
      Write32(loc, static_cast<uint32_t>(rel));
      return RelocResult::kOk;
    case R_X86_64_32:
      if (sa > UINT32_MAX) return RelocResult::kOverflow;
      Write32(loc, static_cast<uint32_t>(sa));
      return RelocResult::kOk;
    case R_X86_64_32S:
      if (!FitsSigned(static_cast<int64_t>(sa), 32)) return RelocResult::kOverflow;
      Write32(loc, static_cast<uint32_t>(sa));
      return RelocResult::kOk;
    default: return RelocResult::kUnsupported;
  }
}

// log2 of the access size of an LDST*_ABS_LO12_NC relocation: its immediate counts
// units of that size.
int LdstScale(uint32_t type) {
  switch (type) {
    case R_AARCH64_LDST16_ABS_LO12_NC: return 1;
    case R_AARCH64_LDST32_ABS_LO12_NC: return 2;
    case R_AARCH64_LDST64_ABS_LO12_NC: return 3;
    case R_AARCH64_LDST128_ABS_LO12_NC: return 4;
    default: return 0;
  }
}

// AArch64 (ELF for the Arm 64-bit Architecture, "Static relocations"): the checked
// ones fail with kOverflow outside the ranges given there.
RelocResult ApplyAArch64(uint32_t type, uint64_t p, uint64_t sa, uint8_t* loc) {
  const int64_t rel = static_cast<int64_t>(sa - p);
  const uint64_t lo12 = sa & 0xFFF;
  int range_bits, shift;  // branches: a signed byte offset of range_bits; its word offset goes at `shift`
  switch (type) {
    case R_AARCH64_NONE: return RelocResult::kOk;
    case R_AARCH64_ABS64: Write64(loc, sa); return RelocResult::kOk;
    case R_AARCH64_PREL64: Write64(loc, sa - p); return RelocResult::kOk;
    case R_AARCH64_PREL32:  // -2^31 <= X < 2^32
      if (rel < INT32_MIN || rel > int64_t{UINT32_MAX}) return RelocResult::kOverflow;
      Write32(loc, static_cast<uint32_t>(rel));
      return RelocResult::kOk;
    case R_AARCH64_ADR_PREL_LO21:  // ADR: +-1 MiB
      if (!FitsSigned(rel, 21)) return RelocResult::kOverflow;
      PatchAdr(loc, static_cast<uint64_t>(rel));
      return RelocResult::kOk;
    case R_AARCH64_ADR_PREL_PG_HI21:  // ADRP: +-4 GiB of pages
    case R_AARCH64_ADR_PREL_PG_HI21_NC: {
      const int64_t pages = static_cast<int64_t>((sa & ~uint64_t{0xFFF}) - (p & ~uint64_t{0xFFF}));
      if (type == R_AARCH64_ADR_PREL_PG_HI21 && !FitsSigned(pages, 33)) return RelocResult::kOverflow;
      PatchAdr(loc, static_cast<uint64_t>(pages) >> 12);
      return RelocResult::kOk;
    }
    case R_AARCH64_ADD_ABS_LO12_NC:  // imm12 in [21:10]
      Patch(loc, 0xFFFu << 10, static_cast<uint32_t>(lo12 << 10));
      return RelocResult::kOk;
    case R_AARCH64_LDST8_ABS_LO12_NC:
    case R_AARCH64_LDST16_ABS_LO12_NC:
    case R_AARCH64_LDST32_ABS_LO12_NC:
    case R_AARCH64_LDST64_ABS_LO12_NC:
    case R_AARCH64_LDST128_ABS_LO12_NC: {
      // No overflow check (_NC), but low bits the scaled immediate cannot hold would
      // silently address the wrong byte.
      const int scale = LdstScale(type);
      if (lo12 & ((uint64_t{1} << scale) - 1)) return RelocResult::kMisaligned;
      Patch(loc, 0xFFFu << 10, static_cast<uint32_t>((lo12 >> scale) << 10));
      return RelocResult::kOk;
    }
    case R_AARCH64_CALL26:
    case R_AARCH64_JUMP26: range_bits = 28, shift = 0; break;  // B/BL: +-128 MiB, imm26 in [25:0]
    case R_AARCH64_CONDBR19: range_bits = 21, shift = 5; break; // B.cond/CBZ: +-1 MiB, imm19 in [23:5]
    case R_AARCH64_TSTBR14: range_bits = 16, shift = 5; break;  // TBZ: +-32 KiB, imm14 in [18:5]
    default: return RelocResult::kUnsupported;
  }
  if (rel & 3) return RelocResult::kMisaligned;
  if (!FitsSigned(rel, range_bits)) return RelocResult::kOverflow;
  const uint32_t mask = ((1u << (range_bits - 2)) - 1) << shift;
  Patch(loc, mask, static_cast<uint32_t>((static_cast<uint64_t>(rel) >> 2) << shift));
  return RelocResult::kOk;
}

// Builds the image; CodeImage takes it only when every step succeeds, else the
// destructor unmaps it.
class Loader {
 public:
  Loader(const uint8_t* data, size_t size, kiln_error_t* error) : data_(data), size_(size), error_(error) {}
  ~Loader() {
    if (base_ != nullptr) FreeCodePages(base_, image_size_);
  }

  kiln_status_t Run();
  void Release(uint8_t** base, size_t* size, const CodeImage::Export** exports, size_t* num_exports) {
    *base = base_;
    *size = image_size_;
    *exports = reinterpret_cast<const CodeImage::Export*>(base_ + exports_offset_);
    *num_exports = num_exports_;
    base_ = nullptr;
  }

 private:
  kiln_status_t Header();
  kiln_status_t Sections();
  kiln_status_t Symbols();
  kiln_status_t Map();
  kiln_status_t Relocate();
  kiln_status_t RelocateSection(uint32_t index);
  kiln_status_t Exports();

  // The string at `offset` of string table `table` (checked in bounds), or nullptr
  // when it does not start and end inside the table.
  const char* Str(const Elf64_Shdr& table, uint64_t offset) const {
    if (offset >= table.sh_size) return nullptr;
    const char* s = reinterpret_cast<const char*>(data_ + table.sh_offset + offset);
    return std::memchr(s, 0, table.sh_size - offset) != nullptr ? s : nullptr;
  }
  // After Sections(): every name is valid.
  const char* SectionName(uint32_t i) const { return Str(shdrs_[shstrndx_], shdrs_[i].sh_name); }
  // After Symbols(): symbol `i` (< num_syms_) and its name (a section symbol's is its
  // section's, when that is a section).
  Elf64_Sym Sym(uint64_t i) const {
    Elf64_Sym s;
    std::memcpy(&s, data_ + shdrs_[symtab_].sh_offset + i * sizeof(Elf64_Sym), sizeof(s));
    return s;
  }
  const char* SymName(const Elf64_Sym& s) const {
    if (ELF64_ST_TYPE(s.st_info) == STT_SECTION && s.st_shndx != SHN_UNDEF && s.st_shndx < shnum_)
      return SectionName(s.st_shndx);
    return Str(shdrs_[strtab_], s.st_name);
  }
  bool Exported(const Elf64_Sym& s) const {
    return ELF64_ST_BIND(s.st_info) == STB_GLOBAL && ELF64_ST_TYPE(s.st_info) == STT_FUNC &&
           s.st_shndx != SHN_UNDEF;
  }

  kiln_status_t Bad(const char* format, ...) __attribute__((format(printf, 2, 3)));

  const uint8_t* data_;
  size_t size_;
  kiln_error_t* error_;
  Elf64_Ehdr eh_;
  uint32_t shnum_ = 0, shstrndx_ = 0, symtab_ = 0, strtab_ = 0;
  uint64_t num_syms_ = 0;
  Allocator heap_;
  Vec<Elf64_Shdr> shdrs_{&heap_};
  Vec<uint64_t> offsets_{&heap_};  // image offset of each section, or kNotLoaded
  uint64_t image_size_ = 0, exports_offset_ = 0, names_offset_ = 0;
  size_t num_exports_ = 0;
  uint8_t* base_ = nullptr;
};

kiln_status_t Loader::Bad(const char* format, ...) {
  char message[sizeof(error_->message)];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  return Fail(error_, KILN_ERROR_ARTIFACT_CODE, "code segment: %s", message);
}

kiln_status_t Loader::Run() {
  kiln_status_t st;
  if ((st = Header()) != KILN_OK || (st = Sections()) != KILN_OK || (st = Symbols()) != KILN_OK ||
      (st = Map()) != KILN_OK || (st = Relocate()) != KILN_OK || (st = Exports()) != KILN_OK)
    return st;
#if defined(__aarch64__)
  // The instruction cache does not snoop the data writes that made the code.
  __builtin___clear_cache(reinterpret_cast<char*>(base_), reinterpret_cast<char*>(base_ + image_size_));
#endif
  if (!ProtectCodePages(base_, image_size_))
    return Fail(error_, KILN_ERROR_UNSUPPORTED,
                "code segment: this system does not let the runtime make its %llu-byte image executable",
                static_cast<ull>(image_size_));
  return KILN_OK;
}

kiln_status_t Loader::Header() {
  if (size_ < sizeof(Elf64_Ehdr))
    return Bad("object of %zu bytes is too short for an ELF64 header", size_);
  std::memcpy(&eh_, data_, sizeof(eh_));
  const unsigned char* id = eh_.e_ident;
  if (std::memcmp(id, ELFMAG, SELFMAG) != 0) return Bad("no ELF magic: not an ELF object");
  if (id[EI_CLASS] != ELFCLASS64) return Bad("ELF class %u: only ELFCLASS64 is supported", id[EI_CLASS]);
  if (id[EI_DATA] != ELFDATA2LSB) return Bad("ELF data encoding %u: only little-endian is supported", id[EI_DATA]);
  if (id[EI_VERSION] != EV_CURRENT || eh_.e_version != EV_CURRENT)
    return Bad("ELF version %u/%u: only EV_CURRENT is supported", id[EI_VERSION], eh_.e_version);
  if (eh_.e_type != ET_REL) return Bad("ELF type %u: only relocatable objects (ET_REL) are supported", eh_.e_type);
  if (eh_.e_machine != EM_X86_64 && eh_.e_machine != EM_AARCH64)
    return Bad("ELF machine %u: only x86-64 and AArch64 are supported", eh_.e_machine);
  if (eh_.e_machine != kHostMachine)
    return Bad("the kernels are built for %s but this runtime runs on %s", MachineName(eh_.e_machine),
               MachineName(kHostMachine));
  if (eh_.e_shentsize != sizeof(Elf64_Shdr))
    return Bad("section header size %u, expected %zu", eh_.e_shentsize, sizeof(Elf64_Shdr));
  // e_shnum == 0 is either no sections or extended numbering: neither is a kernel object.
  if (eh_.e_shnum == 0 || eh_.e_shnum >= SHN_LORESERVE)
    return Bad("%u sections: expected 1 to %u", eh_.e_shnum, SHN_LORESERVE - 1);
  shnum_ = eh_.e_shnum;
  if (!InRange(eh_.e_shoff, uint64_t{shnum_} * sizeof(Elf64_Shdr), size_))
    return Bad("section header table (%u entries at offset %llu) runs past the end of the %zu-byte object",
               shnum_, static_cast<ull>(eh_.e_shoff), size_);
  if (eh_.e_shstrndx == SHN_UNDEF || eh_.e_shstrndx >= shnum_)
    return Bad("section name table index %u out of range (%u sections)", eh_.e_shstrndx, shnum_);
  shstrndx_ = eh_.e_shstrndx;
  return KILN_OK;
}

kiln_status_t Loader::Sections() {
  if (!shdrs_.resize(shnum_) || !offsets_.resize(shnum_))
    return Fail(error_, KILN_ERROR_OUT_OF_MEMORY, "code segment: out of memory for %u section headers", shnum_);
  std::memcpy(shdrs_.data(), data_ + eh_.e_shoff, uint64_t{shnum_} * sizeof(Elf64_Shdr));
  for (uint32_t i = 0; i < shnum_; ++i) offsets_[i] = kNotLoaded;
  // The name table first, so that every other message can name its section.
  const Elf64_Shdr& names = shdrs_[shstrndx_];
  if (names.sh_type != SHT_STRTAB || !InRange(names.sh_offset, names.sh_size, size_))
    return Bad("section name table (section %u) is not a string table inside the object", shstrndx_);

  // Lay out the allocated sections in index order, each at its alignment.
  uint64_t cursor = kPrefixBytes;
  for (uint32_t i = 1; i < shnum_; ++i) {
    const Elf64_Shdr& s = shdrs_[i];
    const char* name = SectionName(i);
    if (name == nullptr) return Bad("section %u: name offset %u lies outside the section name table", i, s.sh_name);
    if (s.sh_type != SHT_NOBITS && !InRange(s.sh_offset, s.sh_size, size_))
      return Bad("section %u '%s': [%llu, +%llu) runs past the end of the %zu-byte object", i, name,
                 static_cast<ull>(s.sh_offset), static_cast<ull>(s.sh_size), size_);
    if (s.sh_type == SHT_REL) return Bad("section %u '%s': SHT_REL relocations are not supported (only SHT_RELA)", i, name);
    if (s.sh_type == SHT_SYMTAB) {
      if (symtab_ != 0) return Bad("sections %u and %u: more than one symbol table", symtab_, i);
      symtab_ = i;
    }
    if (!(s.sh_flags & SHF_ALLOC)) continue;
    // GCC emits .data and .bss also when empty: nothing to load, and a reference to
    // them fails as one to any section that is not loaded.
    if ((s.sh_flags & (SHF_WRITE | SHF_TLS)) && s.sh_size == 0) continue;
    if (s.sh_flags & SHF_WRITE) return Bad("section %u '%s' is writable: kernels must not have writable data", i, name);
    if (s.sh_flags & SHF_TLS) return Bad("section %u '%s' is thread-local: kernels must not have writable data", i, name);
    const bool unwind = s.sh_type == kShtX86_64Unwind && eh_.e_machine == EM_X86_64;
    if (s.sh_type != SHT_PROGBITS && s.sh_type != SHT_NOBITS && s.sh_type != SHT_NOTE && !unwind)
      return Bad("section %u '%s': allocated sections of type 0x%x are not supported", i, name, s.sh_type);
    const uint64_t align = s.sh_addralign == 0 ? 1 : s.sh_addralign;
    if ((align & (align - 1)) != 0 || align > kMaxAlignment)
      return Bad("section %u '%s': alignment %llu is not a power of two <= %llu", i, name,
                 static_cast<ull>(align), static_cast<ull>(kMaxAlignment));
    cursor = (cursor + align - 1) & ~(align - 1);  // cursor <= kMaxImageBytes: no overflow
    if (!InRange(cursor, s.sh_size, kMaxImageBytes))
      return Bad("section %u '%s' of %llu bytes: the image exceeds %llu bytes", i, name,
                 static_cast<ull>(s.sh_size), static_cast<ull>(kMaxImageBytes));
    offsets_[i] = cursor;
    cursor += s.sh_size;
  }
  image_size_ = cursor;
  return KILN_OK;
}

kiln_status_t Loader::Symbols() {
  if (symtab_ == 0) return Bad("no symbol table");
  const Elf64_Shdr& st = shdrs_[symtab_];
  if (st.sh_entsize != sizeof(Elf64_Sym) || st.sh_size % sizeof(Elf64_Sym) != 0)
    return Bad("symbol table (section %u): entry size %llu and size %llu, expected entries of %zu bytes", symtab_,
               static_cast<ull>(st.sh_entsize), static_cast<ull>(st.sh_size), sizeof(Elf64_Sym));
  if (st.sh_link == 0 || st.sh_link >= shnum_ || shdrs_[st.sh_link].sh_type != SHT_STRTAB)
    return Bad("symbol table (section %u): its string table, section %u, is not a string table", symtab_, st.sh_link);
  strtab_ = st.sh_link;
  num_syms_ = st.sh_size / sizeof(Elf64_Sym);

  uint64_t name_bytes = 0;
  for (uint64_t i = 0; i < num_syms_; ++i) {
    const Elf64_Sym s = Sym(i);
    const char* name = Str(shdrs_[strtab_], s.st_name);
    if (name == nullptr) return Bad("symbol %llu: name offset %u lies outside the string table", static_cast<ull>(i), s.st_name);
    const uint16_t shndx = s.st_shndx;
    if (shndx == SHN_UNDEF) continue;  // an error only if a relocation uses it
    const ull n = i;
    const int type = ELF64_ST_TYPE(s.st_info);
    if (type == STT_TLS || type == STT_GNU_IFUNC)
      return Bad("symbol %llu '%s' is %s: not supported", n, name, type == STT_TLS ? "thread-local" : "an IFUNC");
    if (shndx == SHN_COMMON)
      return Bad("symbol %llu '%s' is a common symbol: kernels must not have writable data", n, name);
    if (shndx == SHN_ABS) {
      if (Exported(s)) return Bad("function '%s' has an absolute address, not one in the code segment", name);
      continue;
    }
    if (shndx >= shnum_)  // SHN_XINDEX and the other reserved indices included
      return Bad("symbol %llu '%s': section index %u out of range (%u sections)", n, name, shndx, shnum_);
    const Elf64_Shdr& sec = shdrs_[shndx];
    if (!InRange(s.st_value, s.st_size, sec.sh_size))
      return Bad("symbol %llu '%s' [%llu, +%llu) lies outside its section %u '%s' of %llu bytes", n, SymName(s),
                 static_cast<ull>(s.st_value), static_cast<ull>(s.st_size), shndx, SectionName(shndx),
                 static_cast<ull>(sec.sh_size));
    if (Exported(s)) {
      if (offsets_[shndx] == kNotLoaded || !(sec.sh_flags & SHF_EXECINSTR))
        return Bad("function '%s' lies in section %u '%s', which is not executable code", name, shndx,
                   SectionName(shndx));
      ++num_exports_;
      name_bytes += std::strlen(name) + 1;
    }
  }
  // The table of exports and their names follow the sections.
  exports_offset_ = (image_size_ + alignof(CodeImage::Export) - 1) & ~uint64_t{alignof(CodeImage::Export) - 1};
  uint64_t table_bytes;
  if (__builtin_mul_overflow(uint64_t{num_exports_}, sizeof(CodeImage::Export), &table_bytes) ||
      __builtin_add_overflow(exports_offset_, table_bytes, &names_offset_) ||
      !InRange(names_offset_, name_bytes, kMaxImageBytes))
    return Bad("%zu exported functions: the image exceeds %llu bytes", num_exports_,
               static_cast<ull>(kMaxImageBytes));
  image_size_ = names_offset_ + name_bytes;
  if (image_size_ == kPrefixBytes) return Bad("nothing to load: the object has no allocated sections");
  return KILN_OK;
}

kiln_status_t Loader::Map() {
  base_ = static_cast<uint8_t*>(AllocateCodePages(image_size_));
  if (base_ == nullptr)
    return Fail(error_, KILN_ERROR_OUT_OF_MEMORY, "code segment: cannot map %llu bytes",
                static_cast<ull>(image_size_));
  // NOBITS sections stay as mapped: zero (and untouched, however large they claim to be).
  for (uint32_t i = 1; i < shnum_; ++i) {
    const Elf64_Shdr& s = shdrs_[i];
    if (offsets_[i] != kNotLoaded && s.sh_type != SHT_NOBITS && s.sh_size != 0)
      std::memcpy(base_ + offsets_[i], data_ + s.sh_offset, s.sh_size);
  }
  return KILN_OK;
}

kiln_status_t Loader::Relocate() {
  for (uint32_t i = 1; i < shnum_; ++i) {
    if (shdrs_[i].sh_type != SHT_RELA) continue;
    kiln_status_t st = RelocateSection(i);
    if (st != KILN_OK) return st;
  }
  return KILN_OK;
}

kiln_status_t Loader::RelocateSection(uint32_t index) {
  const Elf64_Shdr& rs = shdrs_[index];
  const char* rname = SectionName(index);
  const uint32_t target = rs.sh_info;
  if (target == 0 || target >= shnum_)
    return Bad("section %u '%s': relocated section index %u out of range (%u sections)", index, rname, target, shnum_);
  if (offsets_[target] == kNotLoaded) return KILN_OK;  // debug info and the like: not loaded
  if (rs.sh_link != symtab_)
    return Bad("section %u '%s': symbol table index %u, expected %u", index, rname, rs.sh_link, symtab_);
  if (rs.sh_entsize != sizeof(Elf64_Rela) || rs.sh_size % sizeof(Elf64_Rela) != 0)
    return Bad("section %u '%s': entry size %llu and size %llu, expected entries of %zu bytes", index, rname,
               static_cast<ull>(rs.sh_entsize), static_cast<ull>(rs.sh_size), sizeof(Elf64_Rela));
  const Elf64_Shdr& ts = shdrs_[target];
  const uint64_t target_address = reinterpret_cast<uintptr_t>(base_) + offsets_[target];
  const uint64_t count = rs.sh_size / sizeof(Elf64_Rela);
  for (uint64_t j = 0; j < count; ++j) {
    Elf64_Rela r;
    std::memcpy(&r, data_ + rs.sh_offset + j * sizeof(Elf64_Rela), sizeof(r));
    const uint32_t type = ELF64_R_TYPE(r.r_info);
    const uint32_t sym_index = ELF64_R_SYM(r.r_info);
    const char* type_name = RelocationName(eh_.e_machine, type);
    if (type_name == nullptr)
      return Bad("section %u '%s': relocation %llu has unsupported type %u", index, rname, static_cast<ull>(j), type);
    if (!InRange(r.r_offset, RelocationWidth(eh_.e_machine, type), ts.sh_size))
      return Bad("section %u '%s': relocation %llu (%s) at offset %llu lies outside section %u '%s' of %llu bytes",
                 index, rname, static_cast<ull>(j), type_name, static_cast<ull>(r.r_offset), target,
                 SectionName(target), static_cast<ull>(ts.sh_size));
    if (sym_index >= num_syms_)
      return Bad("section %u '%s': relocation %llu (%s): symbol index %u out of range (%llu symbols)", index, rname,
                 static_cast<ull>(j), type_name, sym_index, static_cast<ull>(num_syms_));
    const Elf64_Sym sym = Sym(sym_index);
    uint64_t s = 0;  // symbol 0 (STN_UNDEF) stands for the value 0
    if (sym_index != 0) {
      if (sym.st_shndx == SHN_UNDEF)
        return Bad("kernels must not call outside the code segment: undefined symbol '%s' (relocation %llu in "
                   "section %u '%s')", SymName(sym), static_cast<ull>(j), index, rname);
      if (sym.st_shndx == SHN_ABS) {
        s = sym.st_value;
      } else if (offsets_[sym.st_shndx] == kNotLoaded) {
        return Bad("section %u '%s': relocation %llu (%s) refers to '%s' in section %u '%s', which is not loaded",
                   index, rname, static_cast<ull>(j), type_name, SymName(sym), sym.st_shndx,
                   SectionName(sym.st_shndx));
      } else {
        s = reinterpret_cast<uintptr_t>(base_) + offsets_[sym.st_shndx] + sym.st_value;
      }
    }
    const uint64_t sa = s + static_cast<uint64_t>(r.r_addend);
    switch (ApplyRelocation(eh_.e_machine, type, target_address + r.r_offset, sa, base_ + offsets_[target] + r.r_offset)) {
      case RelocResult::kOk: break;
      case RelocResult::kOverflow:
        return Bad("section %u '%s': relocation %llu (%s) against '%s' at offset %llu: the value does not fit the "
                   "field%s", index, rname, static_cast<ull>(j), type_name, SymName(sym), static_cast<ull>(r.r_offset),
                   type == R_X86_64_32 || type == R_X86_64_32S ? " (absolute 32-bit addresses: build with -fPIC)" : "");
      case RelocResult::kMisaligned:
        return Bad("section %u '%s': relocation %llu (%s) against '%s' at offset %llu: the value is misaligned for "
                   "the field", index, rname, static_cast<ull>(j), type_name, SymName(sym), static_cast<ull>(r.r_offset));
      case RelocResult::kUnsupported:
        return Bad("section %u '%s': relocation %llu has unsupported type %u", index, rname, static_cast<ull>(j), type);
    }
  }
  return KILN_OK;
}

kiln_status_t Loader::Exports() {
  auto* table = reinterpret_cast<CodeImage::Export*>(base_ + exports_offset_);
  char* names = reinterpret_cast<char*>(base_ + names_offset_);
  size_t n = 0;
  for (uint64_t i = 0; i < num_syms_; ++i) {
    const Elf64_Sym s = Sym(i);
    if (!Exported(s)) continue;
    const char* name = Str(shdrs_[strtab_], s.st_name);
    const size_t len = std::strlen(name) + 1;
    std::memcpy(names, name, len);
    table[n++] = {names, base_ + offsets_[s.st_shndx] + s.st_value};
    names += len;
  }
  Sort(table, table + n, [](const CodeImage::Export& a, const CodeImage::Export& b) {
    return std::strcmp(a.name, b.name) < 0;
  });
  for (size_t i = 1; i < n; ++i)
    if (std::strcmp(table[i - 1].name, table[i].name) == 0) return Bad("function '%s' is defined twice", table[i].name);
  return KILN_OK;
}

}  // namespace

const char* RelocationName(uint16_t machine, uint32_t type) {
#define KILN_RELOC(name) \
  case name: return #name;
  if (machine == EM_X86_64) {
    switch (type) {
      KILN_RELOC(R_X86_64_NONE)
      KILN_RELOC(R_X86_64_64)
      KILN_RELOC(R_X86_64_PC32)
      KILN_RELOC(R_X86_64_PLT32)
      KILN_RELOC(R_X86_64_32)
      KILN_RELOC(R_X86_64_32S)
      KILN_RELOC(R_X86_64_PC64)
      default: return nullptr;
    }
  }
  if (machine == EM_AARCH64) {
    switch (type) {
      KILN_RELOC(R_AARCH64_NONE)
      KILN_RELOC(R_AARCH64_ABS64)
      KILN_RELOC(R_AARCH64_PREL32)
      KILN_RELOC(R_AARCH64_PREL64)
      KILN_RELOC(R_AARCH64_ADR_PREL_LO21)
      KILN_RELOC(R_AARCH64_ADR_PREL_PG_HI21)
      KILN_RELOC(R_AARCH64_ADR_PREL_PG_HI21_NC)
      KILN_RELOC(R_AARCH64_ADD_ABS_LO12_NC)
      KILN_RELOC(R_AARCH64_LDST8_ABS_LO12_NC)
      KILN_RELOC(R_AARCH64_LDST16_ABS_LO12_NC)
      KILN_RELOC(R_AARCH64_LDST32_ABS_LO12_NC)
      KILN_RELOC(R_AARCH64_LDST64_ABS_LO12_NC)
      KILN_RELOC(R_AARCH64_LDST128_ABS_LO12_NC)
      KILN_RELOC(R_AARCH64_TSTBR14)
      KILN_RELOC(R_AARCH64_CONDBR19)
      KILN_RELOC(R_AARCH64_JUMP26)
      KILN_RELOC(R_AARCH64_CALL26)
      default: return nullptr;
    }
  }
#undef KILN_RELOC
  return nullptr;
}

size_t RelocationWidth(uint16_t machine, uint32_t type) {
  if (RelocationName(machine, type) == nullptr) return 0;
  if (machine == EM_X86_64) {
    switch (type) {
      case R_X86_64_NONE: return 0;
      case R_X86_64_64:
      case R_X86_64_PC64: return 8;
      default: return 4;
    }
  }
  switch (type) {
    case R_AARCH64_NONE: return 0;
    case R_AARCH64_ABS64:
    case R_AARCH64_PREL64: return 8;
    default: return 4;  // PREL32 and the instructions
  }
}

RelocResult ApplyRelocation(uint16_t machine, uint32_t type, uint64_t p, uint64_t sa, uint8_t* loc) {
  if (machine == EM_X86_64) return ApplyX86_64(type, p, sa, loc);
  if (machine == EM_AARCH64) return ApplyAArch64(type, p, sa, loc);
  return RelocResult::kUnsupported;
}

CodeImage::~CodeImage() { Reset(); }

void CodeImage::Reset() {
  if (base_ != nullptr) FreeCodePages(base_, size_);
  base_ = nullptr;
  size_ = 0;
  exports_ = nullptr;
  num_exports_ = 0;
}

kiln_status_t CodeImage::Load(const uint8_t* data, size_t size, kiln_error_t* error) {
  Reset();
  ClearError(error);
  if (data == nullptr && size != 0) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "code segment: no data");
  Loader loader(data, size, error);
  kiln_status_t st = loader.Run();
  if (st != KILN_OK) return st;
  loader.Release(&base_, &size_, &exports_, &num_exports_);
  return KILN_OK;
}

kiln_status_t CodeImage::WritePerfMap(const char* path, kiln_error_t* error) const {
  std::FILE* out = std::fopen(path, "a");
  if (out == nullptr) return Fail(error, KILN_ERROR_IO, "perf map %s: cannot open it for appending", path);
  // The exports are sorted by name; a function ends where the next one by address
  // starts (quadratic in the few exports of an artifact).
  const uintptr_t image_end = reinterpret_cast<uintptr_t>(base_) + size_;
  bool ok = true;
  for (size_t i = 0; i < num_exports_ && ok; ++i) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(exports_[i].address);
    uintptr_t end = image_end;
    for (size_t j = 0; j < num_exports_; ++j) {
      const uintptr_t other = reinterpret_cast<uintptr_t>(exports_[j].address);
      if (other > at && other < end) end = other;
    }
    ok = std::fprintf(out, "%llx %llx %s\n", static_cast<unsigned long long>(at),
                      static_cast<unsigned long long>(end - at), exports_[i].name) > 0;
  }
  if (std::fclose(out) != 0 || !ok) return Fail(error, KILN_ERROR_IO, "perf map %s: write failed", path);
  return KILN_OK;
}

void* CodeImage::Find(const char* name) const {
  if (name == nullptr || num_exports_ == 0) return nullptr;
  const Export* end = exports_ + num_exports_;
  const Export* it = std::lower_bound(exports_, end, name, [](const Export& e, const char* key) {
    return std::strcmp(e.name, key) < 0;
  });
  return it != end && std::strcmp(it->name, name) == 0 ? it->address : nullptr;
}

}  // namespace kiln::rt
