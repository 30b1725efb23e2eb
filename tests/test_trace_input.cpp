// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Reading trace files: gzip detected by its magic bytes, every kind of damage reported with the
// file's name, and the trace-size loader that tests and benchmarks use on the real traces.
// The gzip fixtures were made with Python's gzip.compress(data, mtime=0).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "cistern/errors.hpp"
#include "support/trace_sizes.hpp"
#include "trace/input.hpp"
#include "trace/native_text.hpp"
#include "trace/readers.hpp"

namespace {

namespace fs = std::filesystem;
using cistern::InvalidArgument;
using cistern::trace::gunzip;
using cistern::trace::is_gzip;
using cistern::trace::read_file;
constexpr std::uint64_t default_limit = cistern::trace::default_max_input_bytes;

std::string from_hex(std::string_view hex) {
  std::string bytes;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes += static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16));
  }
  return bytes;
}

/// gzip.compress(b'hello gzip\n', mtime=0): 31 bytes.
const std::string hello_gz =
    from_hex("1f8b0800000000000203cb48cdc9c95748afca2ce00200397c63560b000000");
/// gzip.compress(b'second\n', mtime=0): 27 bytes.
const std::string second_gz = from_hex("1f8b08000000000002032b4e4dcecf4be102007ec00f0607000000");

template <class Action>
std::string error_of(Action action) {
  try {
    action();
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "no error";
}

/// A fresh directory per test for the files it writes.
class TraceInput : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / fmt::format("cistern_{}_{}", test->name(), ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) const {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path.string();
  }

  fs::path dir_;
};

// ---- gzip -------------------------------------------------------------------------------------

TEST_F(TraceInput, PlainFilesAreReadAsTheyAre) {
  const std::string csv = "id,lower,upper,size\n0,0,1,4\n";
  EXPECT_EQ(read_file(write("plain.csv", csv)), csv);
  EXPECT_EQ(read_file(write("empty", "")), "");
  EXPECT_EQ(read_file(write("one_byte", "\x1f")), "\x1f");  // too short to be gzip
  const std::string binary("\x1f\x8a\0\xff", 4);            // almost the magic number
  EXPECT_EQ(read_file(write("binary", binary)), binary);
  EXPECT_EQ(read_file(write("named.gz", csv)), csv);  // the name does not matter
}

TEST_F(TraceInput, GzipIsRecognisedByItsMagicBytesNotItsName) {
  EXPECT_TRUE(is_gzip(hello_gz));
  EXPECT_FALSE(is_gzip("hello"));
  EXPECT_FALSE(is_gzip("\x1f"));
  EXPECT_EQ(read_file(write("hello.gz", hello_gz)), "hello gzip\n");
  EXPECT_EQ(read_file(write("hello.txt", hello_gz)), "hello gzip\n");
  EXPECT_EQ(gunzip(hello_gz, "memory"), "hello gzip\n");
}

TEST_F(TraceInput, ConcatenatedMembersDecompressToTheirConcatenation) {
  EXPECT_EQ(read_file(write("two.gz", hello_gz + second_gz)), "hello gzip\nsecond\n");
  EXPECT_EQ(read_file(write("three.gz", hello_gz + second_gz + hello_gz)),
            "hello gzip\nsecond\nhello gzip\n");
}

TEST_F(TraceInput, ZeroPaddingAfterTheLastMemberIsIgnoredOtherDataIsNot) {
  EXPECT_EQ(read_file(write("padded.gz", hello_gz + std::string(100, '\0'))), "hello gzip\n");
  const std::string path = write("garbage.gz", hello_gz + "junk");
  EXPECT_EQ(error_of([&] { read_file(path); }),
            path + ": unexpected data after the gzip stream, at byte 31");
}

TEST_F(TraceInput, EveryTruncationIsReported) {
  for (std::size_t length = 2; length < hello_gz.size(); ++length) {
    const std::string path = write("cut.gz", hello_gz.substr(0, length));
    EXPECT_EQ(error_of([&] { read_file(path); }), path + ": truncated gzip stream") << length;
  }
  // A second member cut short is as truncated as the first.
  const std::string path = write("cut2.gz", hello_gz + second_gz.substr(0, 12));
  EXPECT_EQ(error_of([&] { read_file(path); }), path + ": truncated gzip stream");
}

TEST_F(TraceInput, CorruptStreamsNameZlibsReason) {
  std::string bad_block = hello_gz;
  bad_block[10] = static_cast<char>(bad_block[10] | 0x06);  // block type 3 is reserved
  std::string bad_crc = hello_gz;
  bad_crc[hello_gz.size() - 8] = static_cast<char>(bad_crc[hello_gz.size() - 8] ^ 0xff);
  std::string bad_method = hello_gz;
  bad_method[2] = 7;  // only deflate (8) exists
  const std::pair<std::string, std::string> cases[] = {
      {bad_block, "invalid block type"},
      {bad_crc, "incorrect data check"},
      {bad_method, "unknown compression method"},
  };
  for (const auto& [bytes, reason] : cases) {
    const std::string path = write("bad.gz", bytes);
    EXPECT_EQ(error_of([&] { read_file(path); }), path + ": not a valid gzip stream: " + reason);
  }
  EXPECT_EQ(error_of([&] { gunzip(bad_crc, "in memory"); }),
            "in memory: not a valid gzip stream: incorrect data check");
}

TEST_F(TraceInput, TheDecompressedSizeIsLimited) {
  const std::string path = write("hello.gz", hello_gz);
  EXPECT_EQ(read_file(path, 11), "hello gzip\n");
  EXPECT_EQ(error_of([&] { read_file(path, 10); }),
            path +
                ": gzip stream decompresses to more than 10 bytes, the limit that guards "
                "against decompression bombs (--max-input-size)");
  EXPECT_EQ(cistern::trace::default_max_input_bytes, std::uint64_t{2} << 30);
  EXPECT_EQ(cistern::trace::ReadOptions{}.max_input_size, cistern::trace::default_max_input_bytes);
}

TEST_F(TraceInput, APlainFileIsLimitedToo) {
  const std::string csv = "id,lower,upper,size\n" + std::string(100000, '\n');
  const std::string path = write("long.csv", csv);
  EXPECT_EQ(read_file(path, csv.size()), csv);
  EXPECT_EQ(error_of([&] { read_file(path, csv.size() - 1); }),
            path + ": the file holds more than " + std::to_string(csv.size() - 1) +
                " bytes, the limit on input size (--max-input-size)");
}

TEST_F(TraceInput, EndlessDeviceFilesStopAtTheLimit) {
  if (!fs::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero";
  EXPECT_EQ(error_of([&] { read_file("/dev/zero", 1 << 20); }),
            "/dev/zero: the file holds more than 1048576 bytes, the limit on input size "
            "(--max-input-size)");
}

TEST_F(TraceInput, ThePrefixCheckSeesTheFirstBlockOnly) {
  // A gzip bomb: 64 MiB of zeros in about 64 KiB. The check sees 64 KiB of zeros and refuses.
  const std::string zeros(std::size_t{64} << 20, '\0');
  const std::string bomb = write("bomb.csv", cistern::trace::native::gzip(zeros, "bomb"));
  std::size_t seen = 0;
  const cistern::trace::PrefixCheck refuse = [&](std::string_view prefix) {
    seen = prefix.size();
    throw InvalidArgument("refused");
  };
  EXPECT_EQ(error_of([&] { read_file(bomb, default_limit, refuse); }), "refused");
  EXPECT_EQ(seen, cistern::trace::input_prefix_bytes);
  // Without a check the limit stops it.
  EXPECT_EQ(error_of([&] { read_file(bomb, 1 << 20); }),
            bomb +
                ": gzip stream decompresses to more than 1048576 bytes, the limit that guards "
                "against decompression bombs (--max-input-size)");
  // A small file: the check sees all of it, decompressed.
  std::string shown;
  const cistern::trace::PrefixCheck keep = [&](std::string_view prefix) { shown = prefix; };
  EXPECT_EQ(read_file(write("hello.gz", hello_gz), default_limit, keep), "hello gzip\n");
  EXPECT_EQ(shown, "hello gzip\n");
  EXPECT_EQ(read_file(write("plain.txt", "plain"), default_limit, keep), "plain");
  EXPECT_EQ(shown, "plain");
}

TEST_F(TraceInput, MissingAndUnreadableFiles) {
  const std::string missing = (dir_ / "missing.pickle").string();
  EXPECT_EQ(error_of([&] { read_file(missing); }),
            missing + ": cannot open: No such file or directory");
  EXPECT_EQ(error_of([&] { read_file(dir_.string()); }),
            dir_.string() + ": cannot read: Is a directory");
}

// ---- the shared traces ------------------------------------------------------------------------

std::string shared() { return cistern::testing::shared_dir(); }

#define SKIP_WITHOUT_TRACES()                                                     \
  if (!cistern::testing::traces_available(shared())) {                            \
    GTEST_SKIP() << "the shared traces are missing: " << shared() << "/traces"    \
                 << " (set CISTERN_SHARED_DIR to the folder that holds traces/)"; \
  }

TEST(TraceInputShared, TheLargestGzipDecompressesToItsRecordedSize) {
  SKIP_WITHOUT_TRACES();
  const std::string path = shared() + "/traces/kineto/df_index_resolver.json.gz";
  // The gzip trailer records 53733385 bytes ("original size modulo 2^32" in `file`).
  EXPECT_EQ(read_file(path).size(), 53733385u);
  EXPECT_EQ(read_file(path, 53733385).size(), 53733385u);
  EXPECT_EQ(error_of([&] { read_file(path, 53733384); }),
            path +
                ": gzip stream decompresses to more than 53733384 bytes, the limit that "
                "guards against decompression bombs (--max-input-size)");
}

struct Expected {
  const char* name;
  std::size_t count;
  unsigned long long sum;
  std::size_t first;
};

// Allocation counts are the README's; sums and first sizes were computed with Python (csv, gzip,
// json, pickle) from the same files, in the same orders.
const Expected expected_sizes[] = {
    {"pytorch/DeComFL/memory.pickle.gz", 7946, 15329073320ull, 154435584},
    {"pytorch/cs336_MAGMA27/memory_snapshot.pickle.gz", 1721, 58890300607ull, 25165824},
    {"pytorch/cs336_Wedsonlin/medium_ctx1024_inference.pickle.gz", 1280, 56655331424ull, 16777216},
    {"pytorch/cs336_Wedsonlin/medium_ctx1024_training.pickle.gz", 7591, 166521770119ull, 16777216},
    {"pytorch/cs336_Wedsonlin/medium_ctx128_inference.pickle.gz", 1280, 2851305568ull, 2097152},
    {"pytorch/cs336_Wedsonlin/medium_ctx128_training.pickle.gz", 6526, 34448091337ull, 2097152},
    {"pytorch/cs336_Wedsonlin/medium_ctx256_inference.pickle.gz", 1280, 6911357024ull, 4194304},
    {"pytorch/cs336_Wedsonlin/medium_ctx256_training.pickle.gz", 6624, 45687989993ull, 4194304},
    {"pytorch/cs336_Wedsonlin/medium_ctx512_inference.pickle.gz", 1666, 16525910064ull, 8388608},
    {"pytorch/cs336_Wedsonlin/medium_ctx512_training.pickle.gz", 7591, 72637134473ull, 8388608},
    {"somas/bert_base.csv", 5620, 56392198611ull, 131072},
    {"somas/resnet50.csv", 1042, 3424204028ull, 19267584},
    {"somas/tiny_bert.csv", 1821, 5555431292ull, 4},
    {"minimalloc/A.1048576.csv", 154, 15071232ull, 5120},
    {"minimalloc/B.1048576.csv", 170, 17871872ull, 6144},
    {"minimalloc/C.1048576.csv", 203, 21476352ull, 29696},
    {"minimalloc/D.1048576.csv", 213, 7328768ull, 9216},
    {"minimalloc/E.1048576.csv", 215, 25556992ull, 4096},
    {"minimalloc/F.1048576.csv", 296, 20930560ull, 64512},
    {"minimalloc/G.1048576.csv", 308, 20795392ull, 81920},
    {"minimalloc/H.1048576.csv", 316, 20830208ull, 39936},
    {"minimalloc/I.1048576.csv", 374, 48854016ull, 29696},
    {"minimalloc/J.1048576.csv", 409, 13794304ull, 1024},
    {"minimalloc/K.1048576.csv", 454, 79005696ull, 15360},
    {"minimalloc/example.input.12.csv", 5, 20ull, 4},
    {"kineto/df_index_resolver.json.gz", 13385, 52469120000ull, 25165824},
};

TEST(TraceSizes, EveryRealTraceYieldsItsAllocations) {
  SKIP_WITHOUT_TRACES();
  const std::vector<cistern::testing::TraceSizes> traces =
      cistern::testing::load_all_trace_sizes(shared());
  ASSERT_EQ(traces.size(), std::size(expected_sizes));
  std::size_t total = 0;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const Expected& expected = expected_sizes[i];
    const std::vector<std::size_t>& sizes = traces[i].sizes;
    SCOPED_TRACE(expected.name);
    EXPECT_EQ(traces[i].name, expected.name);
    ASSERT_EQ(sizes.size(), expected.count);
    EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), 0ull), expected.sum);
    EXPECT_EQ(sizes.front(), expected.first);
    total += sizes.size();
  }
  EXPECT_EQ(total, 68490u);
  EXPECT_EQ(cistern::testing::load_trace_sizes(shared()).size(), 68490u);
}

TEST(TraceSizes, KinetoSizesAreInTimeOrder) {
  SKIP_WITHOUT_TRACES();
  // The file lists events by Ev Idx, which is not the order they happened in; time order is.
  const std::vector<std::size_t> sizes =
      cistern::testing::kineto_sizes(shared() + "/traces/kineto/df_index_resolver.json.gz");
  ASSERT_EQ(sizes.size(), 13385u);
  EXPECT_EQ(std::vector<std::size_t>(sizes.begin(), sizes.begin() + 5),
            (std::vector<std::size_t>{25165824, 6881280, 7217152, 6881280, 37748736}));
}

TEST(TraceSizes, SharedDirComesFromTheEnvironmentFirst) {
  const char* before = std::getenv("CISTERN_SHARED_DIR");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("CISTERN_SHARED_DIR", "/nonexistent/shared", 1);
  EXPECT_EQ(cistern::testing::shared_dir(), "/nonexistent/shared");
  EXPECT_FALSE(cistern::testing::traces_available("/nonexistent/shared"));
  EXPECT_EQ(error_of([] { cistern::testing::load_trace_sizes("/nonexistent/shared"); }),
            "/nonexistent/shared/traces/pytorch: trace folder missing");
  ::setenv("CISTERN_SHARED_DIR", "", 1);  // empty counts as unset
  EXPECT_EQ(cistern::testing::shared_dir(), CISTERN_SHARED_DIR);
  if (before != nullptr) {
    ::setenv("CISTERN_SHARED_DIR", saved.c_str(), 1);
  } else {
    ::unsetenv("CISTERN_SHARED_DIR");
  }
}

TEST_F(TraceInput, LifetimeListsAreReadInAllocationOrder) {
  const std::string path =
      write("t.csv", "id,lower,upper,size\r\na,5,6,10\r\nb,0,1,20\r\nc,5,9,30\r\n\r\n");
  EXPECT_EQ(cistern::testing::lifetime_csv_sizes(path), (std::vector<std::size_t>{20, 10, 30}));
  const std::string gz = write("t.csv.gz", hello_gz);
  EXPECT_EQ(error_of([&] { cistern::testing::lifetime_csv_sizes(gz); }),
            gz + ": expected the header id,lower,upper,size");
  const std::string bad_field = write("f.csv", "id,lower,upper,size\n0,x,1,4\n");
  EXPECT_EQ(error_of([&] { cistern::testing::lifetime_csv_sizes(bad_field); }),
            bad_field + ":2: 'x' is not a non-negative integer");
  const std::string short_line = write("s.csv", "id,lower,upper,size\n0,0,1,4\n1,2,3\n");
  EXPECT_EQ(error_of([&] { cistern::testing::lifetime_csv_sizes(short_line); }),
            short_line + ":3: expected 4 comma-separated fields");
}

TEST_F(TraceInput, KinetoKeepsCudaAllocationsInTimeOrder) {
  const std::string path = write("k.json", R"({"traceEvents": [
    {"name": "[memory]", "ts": 30, "args": {"Device Type": 1, "Ev Idx": 1, "Bytes": 300}},
    {"name": "[memory]", "ts": 10, "args": {"Device Type": 1, "Ev Idx": 9, "Bytes": 100}},
    {"name": "[memory]", "ts": 10, "args": {"Device Type": 1, "Ev Idx": 8, "Bytes": 50}},
    {"name": "[memory]", "ts": 20, "args": {"Device Type": 1, "Ev Idx": 3, "Bytes": -100}},
    {"name": "[memory]", "ts": 5.5, "args": {"Device Type": 0, "Ev Idx": 2, "Bytes": 7}},
    {"name": "aten::add", "ts": 1, "args": {}}
  ]})");
  EXPECT_EQ(cistern::testing::kineto_sizes(path), (std::vector<std::size_t>{50, 100, 300}));
  const std::string broken = write("b.json", R"({"traceEvents": [{"name": "[memory]", "ts": 1}]})");
  EXPECT_EQ(error_of([&] { cistern::testing::kineto_sizes(broken); }),
            broken +
                ": a [memory] event lacks args with a numeric Device Type, Bytes and Ev Idx, "
                "or a ts");
  const std::string not_kineto = write("n.json", "[1, 2]");
  EXPECT_EQ(error_of([&] { cistern::testing::kineto_sizes(not_kineto); }),
            not_kineto +
                ": not a Kineto trace with traceEvents: The JSON element does not have "
                "the requested type.");
}

TEST_F(TraceInput, PytorchSnapshotSizesCoverEveryDevice) {
  // {'segments': [], 'device_traces': [[alloc 5, free_requested 5, alloc 3],
  //                                    [segment_alloc 9, alloc 7]]}, pickle protocol 4
  const std::string path = write(
      "s.pickle",
      from_hex(
          "800495b2000000000000007d94288c087365676d656e7473945d948c0d6465766963655f747261636573945d"
          "94285d94287d94288c06616374696f6e948c05616c6c6f63948c0473697a65944b058c0461646472944b0175"
          "7d"
          "942868078c0e667265655f7265717565737465649468094b05680a4b01757d94286807680868094b03680a4b"
          "02"
          "75655d94287d942868078c0d7365676d656e745f616c6c6f639468094b09680a4b03757d9428680768086809"
          "4b07680a4b04756565752e"));
  EXPECT_EQ(cistern::testing::pytorch_snapshot_sizes(path), (std::vector<std::size_t>{5, 3, 7}));
}

}  // namespace
