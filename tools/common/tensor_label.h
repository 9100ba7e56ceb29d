// The compiler's label of a stored tensor's encoding (bf16, int8_a8, int4_g32_asym, ...),
// for the tools that read artifacts (kiln-inspect, kiln-bench).
#ifndef KILN_TOOLS_COMMON_TENSOR_LABEL_H_
#define KILN_TOOLS_COMMON_TENSOR_LABEL_H_

#include <string>

#include "formats/kiln_format.h"
#include "formats/kiln_generated.h"

namespace kiln::tools {

inline std::string EncodingLabel(const kiln::fb::Tensor* t) {
  const char* name = kiln::format::EncodingName(static_cast<uint8_t>(t->encoding()));
  std::string s = name != nullptr ? name : "unknown";
  if (t->encoding() == kiln::fb::Encoding::INT4) s += "_g" + std::to_string(t->group_size());
  if (!t->symmetric()) s += "_asym";
  if (t->activation() == kiln::fb::ActivationMode::Int8PerToken) s += "_a8";
  return s;
}

}  // namespace kiln::tools

#endif  // KILN_TOOLS_COMMON_TENSOR_LABEL_H_
