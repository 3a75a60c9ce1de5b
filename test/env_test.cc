// The Env's files: RandomAccessFile::NextDataOffset in every implementation (PosixEnv,
// the io_uring Env, the fault-injection Env, the fuzzers' MemoryEnv, and the default).
#include "kvengine/env.h"

#include <memory>
#include <string>

#include "env/fault_injection_env.h"
#include "gtest/gtest.h"
#include "test/fuzz/memory_env.h"
#include "test/test_util.h"
#include "util/aligned_buffer.h"

namespace kvengine {
namespace {

constexpr uint64_t kBlock = 4096;

// A file of four blocks of data in a directory of its own, the second and the fourth
// punched out: data, hole, data, hole.
class NextDataOffsetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Env::Default()->CreateDirIfMissing(dir_.path()).ok());
    std::unique_ptr<WritableFile> file;
    ASSERT_TRUE(Env::Default()->NewWritableFile(path_, FileOptions(), &file).ok());
    ASSERT_TRUE(file->Append(Slice(std::string(4 * kBlock, 'x'))).ok());
    ASSERT_TRUE(file->Sync().ok());
    ASSERT_TRUE(file->Close().ok());
    for (uint64_t hole : {kBlock, 3 * kBlock}) {
      Status s = Env::Default()->PunchHole(path_, hole, kBlock);
      if (s.IsNotSupported()) GTEST_SKIP() << "no holes on this filesystem: " << s.ToString();
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }

  // Where `file` says data resumes at or after `offset`.
  static uint64_t NextData(const RandomAccessFile& file, uint64_t offset) {
    uint64_t data = 0;
    Status s = file.NextDataOffset(offset, &data);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return data;
  }

  // What a file of this layout must answer, as PosixEnv's does.
  static void ExpectHolesFound(const RandomAccessFile& file) {
    EXPECT_EQ(NextData(file, 0), 0u);
    EXPECT_EQ(NextData(file, 100), 100u);
    EXPECT_EQ(NextData(file, kBlock), 2 * kBlock);  // the first hole is skipped
    EXPECT_EQ(NextData(file, kBlock + 100), 2 * kBlock);
    EXPECT_EQ(NextData(file, 2 * kBlock + 1), 2 * kBlock + 1);
    // Only a hole up to the end, and past the end: no data.
    EXPECT_EQ(NextData(file, 3 * kBlock), RandomAccessFile::kNoData);
    EXPECT_EQ(NextData(file, 4 * kBlock), RandomAccessFile::kNoData);
    EXPECT_EQ(NextData(file, 100 * kBlock), RandomAccessFile::kNoData);
  }

  test::TempDir dir_;
  const std::string path_ = dir_.Sub("holes");
};

TEST_F(NextDataOffsetTest, PosixFilesFindTheirHoles) {
  for (bool direct : {false, true}) {
    FileOptions options;
    options.use_direct_io = direct;
    std::unique_ptr<RandomAccessFile> file;
    ASSERT_TRUE(Env::Default()->NewRandomAccessFile(path_, options, &file).ok());
    ExpectHolesFound(*file);
    // Asking does not disturb reads (they are positioned).
    AlignedBuffer block(kBlock);  // aligned for O_DIRECT
    size_t n = 0;
    ASSERT_TRUE(file->Read(2 * kBlock, kBlock, block.data(), &n).ok());
    EXPECT_EQ(n, kBlock);
    EXPECT_EQ(std::string(block.data(), n), std::string(kBlock, 'x')) << "direct=" << direct;
  }
}

TEST_F(NextDataOffsetTest, IoUringFilesAnswerAsTheBaseEnvs) {
  std::string why;
  std::unique_ptr<Env> uring = Env::NewIoUringEnv(Env::Default(), &why);
  if (uring == nullptr) GTEST_SKIP() << "io_uring unavailable: " << why;
  std::unique_ptr<RandomAccessFile> file;
  ASSERT_TRUE(uring->NewRandomAccessFile(path_, FileOptions(), &file).ok());
  ExpectHolesFound(*file);
}

TEST_F(NextDataOffsetTest, FaultInjectionFilesAnswerAsTheBaseAndNeverFail) {
  FaultInjectionEnv env(Env::Default());
  std::unique_ptr<RandomAccessFile> file;
  ASSERT_TRUE(env.NewRandomAccessFile(path_, FileOptions(), &file).ok());
  env.FailAfter(FaultInjectionEnv::Op::kRead, 1);
  ExpectHolesFound(*file);
  EXPECT_EQ(env.injected_failures(), 0);  // it reads no data: the armed fault waits
  char byte;
  size_t n = 0;
  EXPECT_TRUE(file->Read(0, 1, &byte, &n).IsIOError());
  EXPECT_EQ(env.injected_failures(), 1);
}

// A file that knows nothing of holes: the default answer.
class PlainFile final : public RandomAccessFile {
 public:
  Status Read(uint64_t, size_t, char*, size_t* bytes_read) const override {
    *bytes_read = 0;
    return Status::OK();
  }
  uint64_t Size() const override { return 4 * kBlock; }
};

TEST(NextDataOffsetDefaultTest, EveryByteCountsAsData) {
  PlainFile file;
  for (uint64_t offset : {uint64_t{0}, kBlock + 7, 100 * kBlock}) {
    uint64_t data = 1;
    ASSERT_TRUE(file.NextDataOffset(offset, &data).ok());
    EXPECT_EQ(data, offset);
  }
}

TEST(NextDataOffsetMemoryEnvTest, DataUpToTheEndNoneAfter) {
  fuzz::MemoryEnv env;
  env.SetFile("/m/file", std::string(2 * kBlock, 'x'));
  std::unique_ptr<RandomAccessFile> file;
  ASSERT_TRUE(env.NewRandomAccessFile("/m/file", FileOptions(), &file).ok());
  uint64_t data = 0;
  ASSERT_TRUE(file->NextDataOffset(kBlock + 3, &data).ok());
  EXPECT_EQ(data, kBlock + 3);
  ASSERT_TRUE(file->NextDataOffset(2 * kBlock, &data).ok());
  EXPECT_EQ(data, RandomAccessFile::kNoData);
}

}  // namespace
}  // namespace kvengine
