// Several precision tiers of one model in one artifact (kiln-compile --tiers): the
// artifacts compiled for each weight budget, merged so that what they have in common
// is stored once.
//
// Layout of the merged file:
//   [tier 0's header, the root: its `tiers` lists every tier]
//   [tier 1's header] ... [tier N-1's header]          (64-byte aligned each)
//   [the weights of every tier, each distinct byte string once]
//   [tier 0's code segment] ... [tier N-1's code segment]
// Each tier's header is a complete size-prefixed Model whose tensors point into the
// shared weights (a tensor whose bytes equal another tier's points at the same
// offset: a vision encoder compiled to the same precision is stored once) and whose
// segments are the weights region and its own code; a tier whose tokenizer is tier
// 0's leaves it out and uses the root's. A runtime reads tier 0 as an ordinary
// artifact; one that knows tiers picks.
//
// Header-only, on the generated schema's object API: the compiler and the runtime's
// tests use it; the runtime reads tiers through the zero-copy accessors.
#ifndef KILN_FORMATS_TIERS_H_
#define KILN_FORMATS_TIERS_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "formats/kiln_format.h"
#include "formats/kiln_generated.h"

namespace kiln::format {

struct TierInput {
  const uint8_t* data = nullptr;  // a complete artifact
  size_t size = 0;
  uint64_t weight_budget = 0;     // what it was compiled for
};

namespace tiers_detail {

inline uint64_t AlignUp(uint64_t v) { return (v + kAlignment - 1) / kAlignment * kAlignment; }

// One tier's header, packed with every scalar written (ForceDefaults), so that its
// size does not depend on the offsets in it.
inline std::vector<uint8_t> Pack(const fb::ModelT& model) {
  flatbuffers::FlatBufferBuilder b;
  b.ForceDefaults(true);
  b.FinishSizePrefixed(fb::Model::Pack(b, &model), fb::ModelIdentifier());
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

}  // namespace tiers_detail

// Merges complete artifacts of one model, largest tier first, into *out (the file's
// bytes). False, with *error, when an input is not a verifiable artifact with the
// writer's segment layout (weights in segment 0, code in segment 1), or is tiered
// already.
inline bool MergeTiers(const std::vector<TierInput>& inputs, std::vector<uint8_t>* out, std::string* error) {
  using namespace tiers_detail;
  const size_t n = inputs.size();
  if (n < 1 || n > kMaxTiers) {
    *error = "a tiered artifact holds 1 to " + std::to_string(kMaxTiers) + " tiers, not " + std::to_string(n);
    return false;
  }
  std::vector<std::unique_ptr<fb::ModelT>> models(n);
  struct Code {
    const uint8_t* data = nullptr;
    uint64_t size = 0;
  };
  std::vector<Code> code(n);
  for (size_t k = 0; k < n; ++k) {
    const TierInput& in = inputs[k];
    const std::string which = "tier " + std::to_string(k);
    uint32_t fb_size = 0;
    if (in.size >= 12) std::memcpy(&fb_size, in.data, 4);
    if (in.size < 12 || static_cast<uint64_t>(fb_size) + 4 > in.size) {
      *error = which + ": not a Kiln artifact (truncated header)";
      return false;
    }
    flatbuffers::Verifier verifier(in.data, static_cast<size_t>(fb_size) + 4);
    if (!fb::VerifySizePrefixedModelBuffer(verifier)) {
      *error = which + ": the FlatBuffer header fails verification";
      return false;
    }
    const fb::Model* m = fb::GetSizePrefixedModel(in.data);
    models[k].reset(m->UnPack());
    fb::ModelT& t = *models[k];
    if (!t.tiers.empty()) {
      *error = which + ": is a tiered artifact already";
      return false;
    }
    const bool code_in_file = t.code != nullptr && !t.code->library;
    if (t.segments.size() != (code_in_file ? 2u : 1u) || (code_in_file && t.code->segment != 1)) {
      *error = which + ": segments are not laid out as weights then code";
      return false;
    }
    for (const fb::Segment& s : t.segments)
      if (s.offset() + s.size() > in.size || s.offset() + s.size() < s.offset()) {
        *error = which + ": a segment runs past the end of the file";
        return false;
      }
    for (const auto& tensor : t.tensors)
      if (tensor->segment != 0 || tensor->offset < t.segments[0].offset() ||
          tensor->offset + tensor->size > t.segments[0].offset() + t.segments[0].size()) {
        *error = which + ": tensor '" + tensor->name + "' lies outside the weights segment";
        return false;
      }
    if (code_in_file) code[k] = {in.data + t.segments[1].offset(), t.segments[1].size()};
    if (k > 0 && t.text && models[0]->text &&
        (t.text->vocab_size != models[0]->text->vocab_size || t.text->num_layers != models[0]->text->num_layers ||
         t.text->hidden_size != models[0]->text->hidden_size)) {
      *error = which + ": is another model than tier 0 (its text config differs)";
      return false;
    }
  }

  // A tier whose tokenizer is tier 0's leaves it out: the runtime reads the root's.
  auto packed_tokenizer = [](const fb::TokenizerT* t) {
    flatbuffers::FlatBufferBuilder b;
    b.ForceDefaults(true);
    if (t != nullptr) b.Finish(fb::Tokenizer::Pack(b, t));
    return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  };
  const std::vector<uint8_t> root_tokenizer = packed_tokenizer(models[0]->tokenizer.get());
  for (size_t k = 1; k < n; ++k)
    if (models[k]->tokenizer && packed_tokenizer(models[k]->tokenizer.get()) == root_tokenizer)
      models[k]->tokenizer.reset();

  // The weights, each distinct byte string once (found by size and a hash of its first
  // bytes, then compared whole).
  struct Blob {
    const uint8_t* data;
    uint64_t size;
    uint64_t offset;  // from the start of the weights region
  };
  std::vector<Blob> blobs;
  std::multimap<std::pair<uint64_t, uint64_t>, size_t> index;
  std::vector<std::vector<uint64_t>> where(n);  // [tier][tensor] offset in the region
  uint64_t region = 0;
  for (size_t k = 0; k < n; ++k)
    for (const auto& tensor : models[k]->tensors) {
      const uint8_t* bytes = inputs[k].data + tensor->offset;
      const std::pair<uint64_t, uint64_t> key{tensor->size, Checksum64(bytes, tensor->size < 4096 ? tensor->size : 4096)};
      size_t found = blobs.size();
      for (auto [it, end] = index.equal_range(key); it != end; ++it)
        if (std::memcmp(blobs[it->second].data, bytes, tensor->size) == 0) {
          found = it->second;
          break;
        }
      if (found == blobs.size()) {
        blobs.push_back({bytes, tensor->size, region});
        index.emplace(key, found);
        region = AlignUp(region + tensor->size);
      }
      where[k].push_back(blobs[found].offset);
    }

  // Two passes over the headers: their sizes (every scalar written) do not depend on
  // the offsets, so the first pass learns where everything goes.
  std::vector<uint64_t> header_at(n), header_size(n), code_at(n);
  uint64_t weights_at = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t k = 0; k < n; ++k) {
      fb::ModelT& t = *models[k];
      t.segments[0] = fb::Segment(weights_at, region);
      if (code[k].data != nullptr) t.segments[1] = fb::Segment(code_at[k], code[k].size);
      for (size_t i = 0; i < t.tensors.size(); ++i) t.tensors[i]->offset = weights_at + where[k][i];
    }
    models[0]->tiers.clear();
    for (size_t k = 0; k < n; ++k) {
      const uint64_t weight_bytes = models[k]->memory_plan ? models[k]->memory_plan->weight_bytes : 0;
      models[0]->tiers.emplace_back(header_at[k], header_size[k], inputs[k].weight_budget, weight_bytes);
    }
    std::vector<std::vector<uint8_t>> headers(n);
    for (size_t k = 0; k < n; ++k) headers[k] = Pack(*models[k]);
    if (pass == 1) {
      for (size_t k = 0; k < n; ++k)
        if (headers[k].size() != header_size[k]) {
          *error = "tier " + std::to_string(k) + ": header size changed between passes";
          return false;
        }
      uint64_t end = weights_at + region;
      for (size_t k = 0; k < n; ++k)
        if (code[k].data != nullptr) end = code_at[k] + code[k].size;
      out->assign(end, 0);
      for (size_t k = 0; k < n; ++k) std::memcpy(out->data() + header_at[k], headers[k].data(), headers[k].size());
      for (const Blob& b : blobs) std::memcpy(out->data() + weights_at + b.offset, b.data, b.size);
      for (size_t k = 0; k < n; ++k)
        if (code[k].data != nullptr) std::memcpy(out->data() + code_at[k], code[k].data, code[k].size);
      return true;
    }
    uint64_t at = 0;
    for (size_t k = 0; k < n; ++k) {
      header_at[k] = at;
      header_size[k] = headers[k].size();
      at = AlignUp(at + header_size[k]);
    }
    weights_at = at;
    at = weights_at + region;
    for (size_t k = 0; k < n; ++k)
      if (code[k].data != nullptr) {
        code_at[k] = AlignUp(at);
        at = code_at[k] + code[k].size;
      }
  }
  return false;  // not reached
}

}  // namespace kiln::format

#endif  // KILN_FORMATS_TIERS_H_
