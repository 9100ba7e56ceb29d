// Version and status-code behaviour of the public C API.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "kiln/kiln.h"

TEST(Version, LinkedLibraryMatchesHeader) {
  EXPECT_EQ(kiln_version_number(), static_cast<uint32_t>(KILN_VERSION_NUMBER));
  char expected[32];
  std::snprintf(expected, sizeof(expected), "%d.%d.%d", KILN_VERSION_MAJOR,
                KILN_VERSION_MINOR, KILN_VERSION_PATCH);
  EXPECT_STREQ(kiln_version_string(), expected);
}

TEST(Status, OkIsZero) {
  EXPECT_EQ(static_cast<int>(KILN_OK), 0);
  EXPECT_STREQ(kiln_status_message(KILN_OK), "ok");
}

TEST(Status, KnownCodesHaveDistinctMessages) {
  const kiln_status_t codes[] = {
      KILN_OK,           KILN_ERROR_INVALID_ARGUMENT, KILN_ERROR_OUT_OF_MEMORY,
      KILN_ERROR_IO,     KILN_ERROR_UNSUPPORTED,      KILN_ERROR_BUFFER_TOO_SMALL,
      KILN_ERROR_CANCELLED, KILN_ERROR_INTERNAL};
  std::set<std::string> seen;
  for (kiln_status_t code : codes) {
    const char* msg = kiln_status_message(code);
    ASSERT_NE(msg, nullptr);
    EXPECT_GT(std::strlen(msg), 0u);
    EXPECT_TRUE(seen.insert(msg).second) << "duplicate message for code " << code;
    // Generic codes live in 1..99.
    if (code != KILN_OK) {
      EXPECT_GE(static_cast<int>(code), 1);
      EXPECT_LE(static_cast<int>(code), 99);
    }
  }
}

TEST(Status, ArtifactCodesHaveDistinctMessages) {
  const kiln_status_t codes[] = {
      KILN_ERROR_ARTIFACT_NOT_KILN,       KILN_ERROR_ARTIFACT_VERSION,      KILN_ERROR_ARTIFACT_TRUNCATED,
      KILN_ERROR_ARTIFACT_MALFORMED,      KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, KILN_ERROR_ARTIFACT_ALIGNMENT,
      KILN_ERROR_ARTIFACT_SHAPE,          KILN_ERROR_ARTIFACT_OP,           KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL,
      KILN_ERROR_ARTIFACT_CPU_FEATURES,   KILN_ERROR_ARTIFACT_TOKENIZER,    KILN_ERROR_ARTIFACT_CODE};
  std::set<std::string> seen;
  for (kiln_status_t code : codes) {
    const char* msg = kiln_status_message(code);
    EXPECT_TRUE(kiln_status_is_artifact_error(code)) << code;
    EXPECT_STRNE(msg, "artifact error") << "code " << code << " has no message of its own";
    EXPECT_TRUE(seen.insert(msg).second) << "duplicate message for code " << code;
  }
  EXPECT_EQ(static_cast<int>(KILN_ERROR_ARTIFACT_CODE), 111);
}

TEST(Status, UnknownCodesAreDescribedByRange) {
  EXPECT_STREQ(kiln_status_message(static_cast<kiln_status_t>(150)), "artifact error");
  EXPECT_STREQ(kiln_status_message(static_cast<kiln_status_t>(250)), "execution error");
  EXPECT_STREQ(kiln_status_message(static_cast<kiln_status_t>(399)), "input error");
  EXPECT_STREQ(kiln_status_message(static_cast<kiln_status_t>(1000)), "unknown status");
  EXPECT_STREQ(kiln_status_message(KILN_STATUS_MAX_ENUM), "unknown status");
}

TEST(Status, RangeHelpers) {
  EXPECT_TRUE(kiln_status_is_artifact_error(static_cast<kiln_status_t>(100)));
  EXPECT_TRUE(kiln_status_is_artifact_error(static_cast<kiln_status_t>(199)));
  EXPECT_FALSE(kiln_status_is_artifact_error(static_cast<kiln_status_t>(200)));
  EXPECT_TRUE(kiln_status_is_execution_error(static_cast<kiln_status_t>(200)));
  EXPECT_TRUE(kiln_status_is_input_error(static_cast<kiln_status_t>(300)));
  EXPECT_FALSE(kiln_status_is_input_error(KILN_ERROR_IO));
  EXPECT_FALSE(kiln_status_is_artifact_error(KILN_OK));
}

// The header is C: compile-time check that it is usable from C as well lives in
// c_header_test.c, linked into this binary.
extern "C" int kiln_c_header_smoke(void);
TEST(Header, UsableFromC) { EXPECT_EQ(kiln_c_header_smoke(), 0); }
