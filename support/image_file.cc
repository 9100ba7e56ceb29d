#include "support/image_file.h"

#define STB_IMAGE_IMPLEMENTATION
#define STBI_FAILURE_USERMSG
#include <stb/stb_image.h>

namespace kiln::tools {

bool LoadRgbImage(const std::string& path, RgbImage* out, std::string* error) {
  int w = 0, h = 0, channels = 0;
  unsigned char* data = stbi_load(path.c_str(), &w, &h, &channels, 3);
  if (data == nullptr) {
    *error = path + ": cannot decode the image: " + stbi_failure_reason();
    return false;
  }
  out->width = w;
  out->height = h;
  out->pixels.assign(data, data + static_cast<size_t>(w) * h * 3);
  stbi_image_free(data);
  return true;
}

}  // namespace kiln::tools
