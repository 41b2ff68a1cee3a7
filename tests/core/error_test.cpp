// Checked calls: the error carries the library, the statement, file:line and the message.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "core/error.hpp"

using Catch::Matchers::ContainsSubstring;

TEST_CASE("error: ZERO_CHECK_SYS names the call, errno's message, file and line") {
  const int line = __LINE__ + 2;
  try {
    ZERO_CHECK_SYS(::open("/nonexistent-dir/file", O_RDONLY));
    FAIL("open of a missing file succeeded");
  } catch (const zero::Error& e) {
    CHECK(e.library() == "system");
    CHECK(e.statement() == "::open(\"/nonexistent-dir/file\", O_RDONLY)");
    CHECK(e.file() == "tests/core/error_test.cpp");
    CHECK(e.line() == line);
    CHECK_THAT(e.what(), ContainsSubstring("No such file or directory (errno 2)"));
    CHECK_THAT(e.what(), ContainsSubstring("system error: "));
    CHECK_THAT(e.what(), ContainsSubstring("at tests/core/error_test.cpp:" + std::to_string(line)));
  }
  // A file compiled outside this checkout is named from its top-level folder on.
  CHECK(std::string(zero::detail::short_path("/elsewhere/src/core/cuda/device.cpp")) ==
        "core/cuda/device.cpp");
  CHECK(std::string(zero::detail::short_path("/x/runtime/engine/engine.cpp")) ==
        "runtime/engine/engine.cpp");
}

TEST_CASE("error: ZERO_CHECK_SYS accepts successful calls and pointer results") {
  int fd = -1;
  ZERO_CHECK_SYS(fd = ::open("/dev/null", O_RDONLY));
  CHECK(fd >= 0);
  ZERO_CHECK_SYS(::close(fd));
  std::FILE* f = nullptr;
  ZERO_CHECK_SYS(f = std::fopen("/dev/null", "r"));
  std::fclose(f);
  auto open_missing = [] { ZERO_CHECK_SYS(std::fopen("/nonexistent-dir/x", "r")); };
  CHECK_THROWS_AS(open_missing(), zero::Error);
}

TEST_CASE("error: ZERO_REQUIRE is lazy and user-facing") {
  int evaluated = 0;
  auto msg = [&] {
    ++evaluated;
    return std::string("the thing was wrong\nHINT: do this");
  };
  ZERO_REQUIRE(1 + 1 == 2, msg());
  CHECK(evaluated == 0);  // the message is built only on failure
  try {
    ZERO_REQUIRE(1 + 1 == 3, msg());
    FAIL("did not throw");
  } catch (const zero::Error& e) {
    CHECK(evaluated == 1);
    CHECK(e.library() == "zero");
    // Our own errors do not get a "zero error:" prefix: the message speaks for itself.
    CHECK_THAT(e.what(), Catch::Matchers::StartsWith("the thing was wrong\nHINT: do this"));
    CHECK_THAT(e.what(), ContainsSubstring("in 1 + 1 == 3 at tests/core/error_test.cpp:"));
  }
}

TEST_CASE("error: ZERO_FAIL throws with the message") {
  CHECK_THROWS_WITH(ZERO_FAIL("plain failure"), ContainsSubstring("plain failure"));
}
