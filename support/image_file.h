// Image files for the tools (the runtime itself takes pixels): decoded with
// stb_image to 8-bit RGB.
#ifndef KILN_SUPPORT_IMAGE_FILE_H_
#define KILN_SUPPORT_IMAGE_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::tools {

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // width * height * 3, rows tightly packed
};

// PNG, JPEG, BMP, GIF (first frame), TGA, PSD, PNM. Alpha is dropped as PIL's
// convert("RGB") does.
bool LoadRgbImage(const std::string& path, RgbImage* out, std::string* error);

}  // namespace kiln::tools

#endif  // KILN_SUPPORT_IMAGE_FILE_H_
