// AioFile (offload/aio_file.hpp): O_DIRECT where the file system has it and the buffered
// fallback where it does not; open and reservation failures naming the path; the errno
// messages, EIO included (no way to make a drive fail on demand here, so its text is checked
// directly).
#include "offload/aio_file.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cerrno>
#include <string>

#include "core/error.hpp"
#include "tests/offload/scratch_dir.hpp"

using namespace zero::offload;
using Catch::Matchers::ContainsSubstring;
using zero::test::ScratchDir;
using zero::test::ScratchMount;

TEST_CASE("a file on a disk file system opens with O_DIRECT", "[aio]") {
  ScratchDir dir;
  AioFile f(dir.path + "/d", AioFile::Mode::create);
  CHECK(f.is_open());
  CHECK(f.direct());
  AioFile g(dir.path + "/b", AioFile::Mode::create, /*prefer_direct=*/false);
  CHECK_FALSE(g.direct());
  f.allocate(8192);
  CHECK(f.size() == 8192);
}

TEST_CASE("a file system refusing O_DIRECT gives a buffered file", "[aio]") {
  ScratchMount m("ramfs", "");
  if (!m.mounted) SKIP(m.why);
  AioFile f(m.path() + "/x", AioFile::Mode::create);
  CHECK(f.is_open());
  CHECK_FALSE(f.direct());
}

TEST_CASE("opening in a missing directory names the path", "[aio]") {
  ScratchDir dir;
  const std::string p = dir.path + "/missing/x";
  CHECK_THROWS_WITH(AioFile(p, AioFile::Mode::create),
                    ContainsSubstring(p) && ContainsSubstring("ENOENT"));
  CHECK_THROWS_WITH(AioFile(dir.path + "/absent", AioFile::Mode::read),
                    ContainsSubstring("absent") && ContainsSubstring("does not exist"));
}

TEST_CASE("reserving more than the drive holds fails with ENOSPC", "[aio]") {
  ScratchMount m("tmpfs", "size=1m");
  if (!m.mounted) SKIP(m.why);
  AioFile f(m.path() + "/big", AioFile::Mode::create);
  CHECK_THROWS_WITH(f.allocate(8 << 20),
                    ContainsSubstring(m.path() + "/big") && ContainsSubstring("ENOSPC"));
}

TEST_CASE("io error messages say what failed and what to do", "[aio]") {
  const std::string eio = io_error_message("/nvme/x.swp", "read of 4096 bytes at offset 0", EIO);
  CHECK_THAT(eio, ContainsSubstring("/nvme/x.swp") && ContainsSubstring("EIO") &&
                      ContainsSubstring("dmesg") && ContainsSubstring("read of 4096"));
  CHECK_THAT(io_error_message("/p", "write", ENOSPC),
             ContainsSubstring("ENOSPC") && ContainsSubstring("free space"));
  CHECK_THAT(io_error_message("/p", "open", EROFS), ContainsSubstring("read-only"));
  CHECK_THAT(io_error_message("/p", "open", EACCES), ContainsSubstring("permissions"));
  CHECK_THAT(io_error_message("/p", "open", EBADF), ContainsSubstring("errno 9"));
}
