// The code segment of an artifact: one relocatable ELF64 object (ET_REL,
// little-endian) of compiler-generated micro-kernels for the running CPU, linked in
// process without dlopen: parsed, laid out in one anonymous mapping, relocated, then
// made read+execute (never writable and executable at once).
//
// The bytes come from a file, so this is a security boundary: every offset, size and
// index is checked with overflow-safe arithmetic before use, and anything outside the
// small subset a kernel object needs is refused with KILN_ERROR_ARTIFACT_CODE:
//   - sections: allocated PROGBITS/NOBITS/NOTE (and x86-64 .eh_frame's UNWIND type),
//     alignment a power of two <= 4096; nothing writable or thread-local but empty
//     sections (kernels keep no state), no constructors; non-allocated sections (debug
//     info, .comment, ...) and their relocations are ignored.
//   - symbols: one SHT_SYMTAB; undefined symbols only if no relocation uses them (the
//     kernels must not call outside the segment: there is nothing to bind them to);
//     no SHN_COMMON, TLS or IFUNC. Exported are the STB_GLOBAL STT_FUNC symbols.
//   - relocations: SHT_RELA with the types a position-independent kernel object uses
//     for references inside itself (see RelocationName); no GOT, no PLT, no TLS.
#ifndef KILN_RUNTIME_CODE_ELF_LOADER_H_
#define KILN_RUNTIME_CODE_ELF_LOADER_H_

#include <cstddef>
#include <cstdint>

#include "kiln/kiln.h"

namespace kiln::rt {

// A loaded code segment: the generated kernels of one artifact, mapped read+exec.
class CodeImage {
 public:
  CodeImage() = default;
  ~CodeImage();  // unmaps
  CodeImage(const CodeImage&) = delete;
  CodeImage& operator=(const CodeImage&) = delete;

  // Loads the relocatable ELF64 object [data, data+size) built for the running
  // build's architecture (EM_X86_64 or EM_AARCH64; another machine fails with
  // KILN_ERROR_ARTIFACT_CODE naming both). Replaces what was loaded before. On
  // failure returns the status, fills *error with a message naming the section,
  // relocation or symbol at fault, and leaves *this empty. `data` need not be
  // aligned and is not referenced after the call.
  kiln_status_t Load(const uint8_t* data, size_t size, kiln_error_t* error);

  // Address of the global (STB_GLOBAL, defined, STT_FUNC) symbol `name`, or nullptr.
  void* Find(const char* name) const;

  // Bytes of the image: a small zero prefix, the sections with their padding, and the
  // table of exported functions.
  size_t mapped_bytes() const { return size_; }

  // Appends "ADDRESS SIZE NAME" per exported function to `path` (the perf map format),
  // each function's size up to the next one's start or the image's end.
  kiln_status_t WritePerfMap(const char* path, kiln_error_t* error) const;

  // An exported function; the table and the names live at the end of the image.
  struct Export {
    const char* name;
    void* address;
  };

 private:
  void Reset();

  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  const Export* exports_ = nullptr;  // sorted by name
  size_t num_exports_ = 0;
};

// Relocation arithmetic of both supported machines, independent of the machine the
// runtime runs on (plain functions of the type, the place P, the value S + A and the
// bytes at P).
enum class RelocResult { kOk, kUnsupported, kOverflow, kMisaligned };

// The ELF name of relocation `type` of `machine` ("R_X86_64_PC32"), or nullptr if
// the loader does not support it.
const char* RelocationName(uint16_t machine, uint32_t type);

// Bytes a supported relocation patches at its offset (0 for the NONE types).
size_t RelocationWidth(uint16_t machine, uint32_t type);

// Patches loc[0, RelocationWidth(machine, type)) for a relocation at address `p`
// whose target is `sa` (= S + A). kOverflow: the value does not fit the field;
// kMisaligned: it is not a multiple of the field's scale. `loc` is unchanged unless
// the result is kOk.
RelocResult ApplyRelocation(uint16_t machine, uint32_t type, uint64_t p, uint64_t sa, uint8_t* loc);

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_CODE_ELF_LOADER_H_
