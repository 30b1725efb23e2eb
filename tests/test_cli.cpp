// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// End-to-end tests of the `cistern` program: they run the built binary on the shared traces and
// on small files written to a temporary folder, and check exit codes, the JSON schema and
// values (peak_live against ../shared/traces/README.md), `info`, `convert` round trips, the
// HTML report and `--help`. The binary's path comes from the CISTERN_CLI compile definition
// (tests/CMakeLists.txt) or the CISTERN_CLI environment variable; without either the tests skip.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cistern/pytorch_snapshot.hpp"
#include "support/reference_figures.hpp"
#include "support/trace_sizes.hpp"
#include "trace/native_text.hpp"
#include "trace/pickle.hpp"
#include "trace/readers.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string cli_path() {
  if (const char* env = std::getenv("CISTERN_CLI"); env != nullptr && *env) return env;
#ifdef CISTERN_CLI
  return CISTERN_CLI;
#else
  return "";
#endif
}

std::string quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

struct Outcome {
  int code = -1;
  std::string out;
  std::string err;
};

/// A temporary folder per test, removed afterwards, and a way to run the program in it.
class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    binary_ = cli_path();
    if (binary_.empty() || !fs::exists(binary_))
      GTEST_SKIP() << "the cistern binary is not known (set CISTERN_CLI)";
    char pattern[] = "/tmp/cistern-cli-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    shared_ = cistern::testing::shared_dir();
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  /// Runs `cistern ARGS` (already quoted where needed) with stdin closed; stdout goes to
  /// `stdout_to` when given (then `out` is empty).
  Outcome run(const std::string& args, const std::string& stdout_to = "") const {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    write(out, "");
    const std::string command = quote(binary_) + " " + args + " </dev/null >" +
                                quote(stdout_to.empty() ? out.string() : stdout_to) + " 2>" +
                                quote(err.string());
    const int status = std::system(command.c_str());
    Outcome o;
    o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    o.out = slurp(out);
    o.err = slurp(err);
    return o;
  }

  std::string trace(const std::string& name) const {
    const fs::path path = fs::path(shared_) / "traces" / name;
    return path.string();
  }
  bool have_traces() const { return cistern::testing::traces_available(shared_); }
  fs::path temp(const std::string& name) const { return dir_ / name; }

  /// Writes a lifetime list of `sizes`, each live for one step after the previous one started.
  fs::path lifetimes(const std::string& name, const std::vector<std::uint64_t>& sizes) const {
    std::string csv = "id,lower,upper,size\n";
    for (std::size_t i = 0; i < sizes.size(); ++i)
      csv += std::to_string(i) + "," + std::to_string(i) + "," + std::to_string(i + 2) + "," +
             std::to_string(sizes[i]) + "\n";
    write(temp(name), csv);
    return temp(name);
  }

  std::string binary_;
  fs::path dir_;
  std::string shared_;
};

#define REQUIRE_TRACES() \
  if (!have_traces()) GTEST_SKIP() << "no shared traces at " << shared_ << "/traces"

const json* find_row(const json& doc, const std::string& policy) {
  for (const json& row : doc.at("results"))
    if (row.at("policy") == policy) return &row;
  return nullptr;
}

// --- help, version, usage errors ----------------------------------------------------------------

TEST_F(Cli, HelpOnEverySubcommandExitsZeroAndListsExitCodes) {
  const Outcome top = run("--help");
  EXPECT_EQ(top.code, 0) << top.err;
  for (const char* word : {"replay", "info", "convert", "options", "Exit status", "4"})
    EXPECT_NE(top.out.find(word), std::string::npos) << word << "\n" << top.out;
  for (const std::string sub : {"replay", "info", "convert", "plan", "options"}) {
    const Outcome o = run(sub + " --help");
    EXPECT_EQ(o.code, 0) << sub << ": " << o.err;
    EXPECT_NE(o.out.find("Exit status"), std::string::npos) << sub;
    EXPECT_NE(o.out.find(sub), std::string::npos) << sub;
  }
  const Outcome replay = run("replay --help");
  for (const char* flag : {"--policy", "--capacity", "--min-capacity", "--device", "--json",
                           "--html", "--start", "--scale"})
    EXPECT_NE(replay.out.find(flag), std::string::npos) << flag;
}

TEST_F(Cli, VersionAndOptions) {
  const Outcome v = run("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_FALSE(v.out.empty());
  const Outcome o = run("options");
  EXPECT_EQ(o.code, 0);
  EXPECT_NE(o.out.find("max_split_size_mb"), std::string::npos);
  EXPECT_NE(o.out.find("|"), std::string::npos);
}

TEST_F(Cli, UsageErrorsExitTwoWithAHint) {
  const fs::path csv = lifetimes("ok.csv", {1024, 2048});
  const std::string file = quote(csv.string());
  const std::vector<std::string> commands = {"",
                                             "bogus",
                                             "replay",
                                             "replay --bogus " + file,
                                             "replay --capacity 12zz " + file,
                                             "replay --capacity 0 " + file,
                                             "replay --policy jemalloc " + file,
                                             "replay --policy cistern:no_such_key=1 " + file,
                                             "replay --start hot " + file,
                                             "replay --format nonsense " + file,
                                             "replay --scale -1 " + file,
                                             "replay --scale nan " + file,
                                             "replay --scale inf " + file,
                                             "info --max-input-size 0 " + file,
                                             "info --max-input-size lots " + file,
                                             "info",
                                             "convert " + file};
  for (const std::string& args : commands) {
    const Outcome o = run(args);
    EXPECT_EQ(o.code, 2) << "cistern " << args << "\n" << o.err;
    EXPECT_FALSE(o.err.empty()) << args;
  }
  const Outcome o = run("replay --policy jemalloc " + file);
  EXPECT_NE(o.err.find("cistern: "), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("--help"), std::string::npos) << o.err;
}

// --- bad input ----------------------------------------------------------------------------------

TEST_F(Cli, BadInputExitsThreeNamingTheFile) {
  write(temp("malformed.csv"), "id,lower,upper,size\n1,5,2,nonsense\n");
  // PROTO 2, GLOBAL 'os system', STOP: a pickle that would call a function.
  write(temp("evil.pickle"), std::string("\x80\x02") + "cos\nsystem\n.");
  write(temp("empty.pickle"), "");
  std::vector<std::string> files = {temp("does-not-exist.pickle").string(),
                                    temp("malformed.csv").string(), temp("evil.pickle").string(),
                                    temp("empty.pickle").string()};
  if (have_traces()) {  // the first half of a real gzipped snapshot
    const std::string gz = slurp(trace("pytorch/DeComFL/memory.pickle.gz"));
    write(temp("truncated.pickle.gz"), gz.substr(0, gz.size() / 2));
    files.push_back(temp("truncated.pickle.gz").string());
  }
  for (const std::string& file : files) {
    for (const std::string command : {"replay", "info"}) {
      const Outcome o = run(command + " " + quote(file));
      EXPECT_EQ(o.code, 3) << command << " " << file << "\n" << o.err;
      EXPECT_EQ(o.err.rfind("cistern: ", 0), 0u) << o.err;
      EXPECT_NE(o.err.find(fs::path(file).filename().string()), std::string::npos) << o.err;
    }
  }
}

TEST_F(Cli, NonTracesAreRefusedFromTheirFirstBlock) {
  // A gzip bomb (64 MiB of zeros in about 64 KiB), whatever its name, and /dev/zero: refused
  // from the first block, before the rest is read.
  const std::string zeros(std::size_t{64} << 20, '\0');
  write(temp("bomb.pickle.gz"), cistern::trace::native::gzip(zeros, "bomb"));
  std::vector<std::string> files = {temp("bomb.pickle.gz").string()};
  if (fs::exists("/dev/zero")) files.emplace_back("/dev/zero");
  for (const std::string& file : files) {
    const Outcome o = run("info " + quote(file));
    EXPECT_EQ(o.code, 3) << file << "\n" << o.err;
    EXPECT_EQ(o.err.rfind("cistern: " + file +
                              ": unknown trace format (it starts with "
                              "'\\x00\\x00",
                          0),
              0u)
        << o.err;
  }
}

TEST_F(Cli, MaxInputSizeBoundsWhatIsRead) {
  // A lifetime list whose header is right and whose rest is 8 MiB of blank lines, gzipped.
  const std::string csv = "id,lower,upper,size\n" + std::string(std::size_t{8} << 20, '\n');
  write(temp("long.csv.gz"), cistern::trace::native::gzip(csv, "long"));
  write(temp("long.csv"), csv);
  for (const std::string name : {"long.csv.gz", "long.csv"}) {
    const std::string file = temp(name).string();
    const Outcome o = run("info --max-input-size 1MiB " + quote(file));
    EXPECT_EQ(o.code, 3) << o.err;
    EXPECT_NE(o.err.find(file + ": "), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("more than 1048576 bytes"), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("(--max-input-size)"), std::string::npos) << o.err;
    // Within the limit it reads (a header and no rows: an empty trace).
    EXPECT_EQ(run("info --max-input-size 9MiB " + quote(file)).code, 0) << file;
  }
}

TEST_F(Cli, CrlfAndByteOrderMarkInputsAreRead) {
  write(temp("excel.csv"), "\xef\xbb\xbfid,lower,upper,size\r\na,0,2,4\r\nb,1,3,8\r\n");
  const Outcome o = run("info --json " + quote(temp("excel.csv").string()));
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(json::parse(o.out).at("peak_live"), 12);
}

// --- output that cannot be written --------------------------------------------------------------

TEST_F(Cli, AFullStdoutIsAnErrorNamingTheReason) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string csv = quote(lifetimes("ok.csv", {1024, 2048}).string());
  for (const std::string& args :
       {"info " + csv, "info --json " + csv, "replay " + csv, "replay --json - " + csv,
        "convert " + csv + " -", "convert --to lifetimes " + csv + " -", std::string("options")}) {
    const Outcome o = run(args, "/dev/full");
    EXPECT_EQ(o.code, 3) << args << "\n" << o.err;
    EXPECT_EQ(o.err, "cistern: cannot write to standard output: No space left on device\n") << args;
  }
}

TEST_F(Cli, OutputFilesThatCannotBeWrittenNameTheFileAndTheReason) {
  const std::string csv = quote(lifetimes("ok.csv", {1024, 2048}).string());
  if (fs::exists("/dev/full")) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"replay -q -p cistern --snapshot /dev/full " + csv, "snapshot"},
        {"replay -q --json /dev/full " + csv, "--json"},
        {"replay -q --html /dev/full " + csv, "--html"},
        {"convert " + csv + " /dev/full", "trace"},
        {"convert --to lifetimes " + csv + " /dev/full", "convert"}};
    for (const auto& [args, what] : cases) {
      const Outcome o = run(args);
      EXPECT_EQ(o.code, 3) << args << "\n" << o.err;
      EXPECT_EQ(o.err, "cistern: " + what + ": cannot write '/dev/full': No space left on device\n")
          << args;
    }
  }
  // A folder where a file should be.
  const Outcome o = run("convert " + csv + " " + quote(dir_.string()));
  EXPECT_EQ(o.code, 3) << o.err;
  EXPECT_EQ(o.err, "cistern: convert: cannot write '" + dir_.string() + "': Is a directory\n");
}

TEST_F(Cli, OutputPathsAreCheckedBeforeAnyTraceIsRead) {
  // The trace does not exist: an output error rather than the trace's shows the order.
  const std::string missing = quote(temp("missing.csv").string());
  write(temp("file.csv"), "id,lower,upper,size\n");
  const std::vector<std::pair<std::string, std::string>> paths = {
      {dir_.string(), "Is a directory"},
      {(dir_ / "no-such-folder" / "out").string(), "No such file or directory"},
      {(dir_ / "file.csv" / "out").string(), "Not a directory"}};
  for (const auto& [path, reason] : paths) {
    const std::vector<std::pair<std::string, std::string>> commands = {
        {"replay --json " + quote(path) + " " + missing, "--json"},
        {"replay --html " + quote(path) + " " + missing, "--html"},
        {"replay --snapshot " + quote(path) + " " + missing, "--snapshot"},
        {"advise --json " + quote(path) + " " + missing, "--json"},
        {"advise --html " + quote(path) + " " + missing, "--html"},
        {"plan --out " + quote(path) + " " + missing, "--out"},
        {"plan --json " + quote(path) + " " + missing, "--json"},
        {"convert " + missing + " " + quote(path), "convert"}};
    for (const auto& [args, what] : commands) {
      const Outcome o = run(args);
      EXPECT_EQ(o.code, 3) << args << "\n" << o.err;
      EXPECT_EQ(o.err, "cistern: " + what + ": cannot write '" + path + "': " + reason + "\n")
          << args;
    }
  }
  // A writable path passes the check untouched: an existing file keeps its bytes, a new one is
  // not left behind, when the work then fails on the trace.
  write(temp("old.json"), "kept");
  for (const std::string& out : {temp("old.json").string(), temp("new.json").string()}) {
    const Outcome o = run("replay --json " + quote(out) + " " + missing);
    EXPECT_EQ(o.code, 3) << o.err;
    EXPECT_NE(o.err.find("missing.csv"), std::string::npos) << o.err;
  }
  EXPECT_EQ(slurp(temp("old.json")), "kept");
  EXPECT_FALSE(fs::exists(temp("new.json")));
}

TEST_F(Cli, ASnapshotWithoutHistoryIsAnErrorThatSaysHowToRecordOne) {
  // What torch.cuda.memory._dump_snapshot() writes without _record_memory_history(): the
  // segments (one block live) and device_traces == [[]].
  cistern::DeviceRecord record;
  cistern::SegmentInfo held;
  held.address = 0x7f0000000000;
  held.total_size = 2u << 20;
  held.blocks = {{held.address, 1024, 1000, cistern::BlockState::active_allocated},
                 {held.address + 1024, (2u << 20) - 1024, 0, cistern::BlockState::inactive}};
  record.snapshot.segments = {held};
  write(temp("no-history.pickle"), cistern::pytorch_snapshot_pickle({record}, cistern::Config{}));
  const std::string file = temp("no-history.pickle").string();
  const std::string message =
      "cistern: " + file +
      ": the snapshot holds no allocation history (device_traces has no events): it was dumped "
      "without recording one. Call torch.cuda.memory._record_memory_history() before the work, "
      "then torch.cuda.memory._dump_snapshot(\"memory.pickle\") after it\n";
  for (const char* command : {"replay ", "replay -q --start warm -p torch ", "replay --json - ",
                              "advise ", "advise --json - ", "plan "}) {
    const Outcome o = run(command + quote(file));
    EXPECT_EQ(o.code, 3) << command << "\n" << o.err;
    EXPECT_EQ(o.err, message) << command;
    EXPECT_EQ(o.out, "") << command;
  }
  // `info` still describes what it holds, and says that it has no history.
  const Outcome info = run("info " + quote(file));
  EXPECT_EQ(info.code, 0) << info.err;
  EXPECT_NE(info.out.find("\n  history                   none: dumped without "
                          "torch.cuda.memory._record_memory_history() (replay, advise and plan "
                          "refuse it)\n"),
            std::string::npos)
      << info.out;
  const Outcome info_json = run("info --json " + quote(file));
  ASSERT_EQ(info_json.code, 0) << info_json.err;
  EXPECT_EQ(json::parse(info_json.out).at("has_history"), false);
  const fs::path csv = lifetimes("ok.csv", {1024});
  EXPECT_EQ(json::parse(run("info --json " + quote(csv.string())).out).at("has_history"), true);
}

// --- out of memory ------------------------------------------------------------------------------

TEST_F(Cli, OutOfMemoryAtTheGivenCapacityExitsFour) {
  const fs::path csv = lifetimes("big.csv", {64ull << 20, 64ull << 20, 64ull << 20});
  const fs::path out = temp("oom.json");
  const Outcome o = run("replay --capacity 100MiB --policy cistern,nocache --json " +
                        quote(out.string()) + " " + quote(csv.string()));
  EXPECT_EQ(o.code, 4) << o.err;
  EXPECT_NE(o.err.find("out of memory"), std::string::npos) << o.err;
  const json doc = json::parse(slurp(out));
  for (const json& row : doc.at("results")) EXPECT_GT(row.at("ooms").get<int>(), 0) << row;
  // Enough capacity: no OOM, exit 0.
  EXPECT_EQ(run("replay --capacity 1GiB -q " + quote(csv.string())).code, 0);
}

// --- JSON ---------------------------------------------------------------------------------------

TEST_F(Cli, JsonRowsHaveTheSchemaAndTheRecordedRow) {
  REQUIRE_TRACES();
  const fs::path out = temp("r.json");
  const Outcome o = run("replay --json " + quote(out.string()) + " " +
                        quote(trace("pytorch/DeComFL/memory.pickle.gz")));
  ASSERT_EQ(o.code, 0) << o.err;
  const json doc = json::parse(slurp(out));
  ASSERT_TRUE(doc.at("results").is_array());
  ASSERT_EQ(doc.at("results").size(), 4u);  // recorded, cistern, torch, nocache
  for (const json& row : doc.at("results")) {
    for (const char* key :
         {"trace", "device", "policy", "capacity", "peak_live", "peak_reserved", "overhead",
          "min_capacity", "ooms", "device_allocs", "device_frees", "ns_per_op", "start"})
      EXPECT_TRUE(row.contains(key)) << key << " in " << row;
    EXPECT_EQ(row.at("peak_live").get<std::uint64_t>(), 1783664516u);
    EXPECT_TRUE(row.at("min_capacity").is_null());  // not asked for
    EXPECT_EQ(row.at("device"), 0);
  }
  const json* recorded = find_row(doc, "recorded");
  ASSERT_NE(recorded, nullptr);
  EXPECT_EQ(recorded->at("peak_reserved").get<std::uint64_t>(), 1897922560u);
  EXPECT_TRUE(recorded->at("capacity").is_null());
  EXPECT_NEAR(recorded->at("overhead").get<double>(), 0.0641, 0.0001);
  for (const char* policy : {"cistern", "torch", "nocache"}) {
    const json* row = find_row(doc, policy);
    ASSERT_NE(row, nullptr) << policy;
    EXPECT_EQ(row->at("capacity").get<std::uint64_t>(), 80ull << 30);
    EXPECT_EQ(row->at("start"), "cold");
    EXPECT_GE(row->at("peak_reserved").get<std::uint64_t>(), 1783664516u);
    EXPECT_EQ(row->at("ooms"), 0);
    // cistern's engine maps pages of physical handles: it makes no segment allocation.
    EXPECT_EQ(row->at("device_allocs").get<int>() > 0, std::string(policy) != "cistern") << policy;
  }
  // The table went to stdout, naming the trace and every policy.
  for (const char* word : {"memory.pickle.gz", "recorded", "cistern", "torch", "nocache", "6.41%"})
    EXPECT_NE(o.out.find(word), std::string::npos) << word << "\n" << o.out;
}

TEST_F(Cli, CostModelIsChosenByNameOrFileAndNamedInTheJson) {
  const fs::path csv = lifetimes("small.csv", {3u << 20, 5u << 20, 7u << 20});
  const auto replay = [&](const std::string& model) {
    const Outcome o = run("replay -q --policy nocache,torch --cost-model " + quote(model) +
                          " --json - " + quote(csv.string()));
    EXPECT_EQ(o.code, 0) << model << "\n" << o.err;
    return o.code == 0 ? json::parse(o.out) : json();
  };
  const json h200 = replay("h200");
  ASSERT_FALSE(h200.is_null());
  EXPECT_EQ(h200.at("cost_model").at("name"), "h200");
  const json& defaults = h200.at("cost_model").at("fields");
  ASSERT_EQ(defaults.size(), 20u);

  // a100: the published 2 MiB figures, the rest the H200's.
  const json a100 = replay("a100");
  const json& a = a100.at("cost_model").at("fields");
  EXPECT_EQ(a100.at("cost_model").at("name"), "a100");
  EXPECT_DOUBLE_EQ(a.at("create_ns").get<double>() + 2 * a.at("create_ns_per_mib").get<double>(),
                   193'000);
  EXPECT_DOUBLE_EQ(a.at("map_ns").get<double>(), 1'450);
  EXPECT_EQ(a.at("release_ns"), defaults.at("release_ns"));
  EXPECT_EQ(a.at("alloc_ns"), defaults.at("alloc_ns"));

  // A file: its fields over the H200's, named by its path.
  const fs::path subset = temp("subset.json");
  write(subset, R"({"create_ns": 5, "release_ns": null})");
  const json partial = replay(subset.string());
  EXPECT_EQ(partial.at("cost_model").at("name"), subset.string());
  for (const auto& [field, value] : defaults.items()) {
    const double expected = field == "create_ns" ? 5.0 : value.get<double>();
    EXPECT_DOUBLE_EQ(partial.at("cost_model").at("fields").at(field).get<double>(), expected)
        << field;
  }

  // Every field set: segments alone priced, so device_ms follows from the counted calls.
  json only_segments = json::object();
  for (const auto& [field, value] : defaults.items()) only_segments[field] = 0;
  only_segments["alloc_ns"] = 1000;
  only_segments["free_ns"] = 300;
  only_segments["free_ns_per_mib"] = 2;
  const fs::path file = temp("segments.json");
  write(file, only_segments.dump());
  const json priced = replay(file.string());
  for (const json& row : priced.at("results")) {
    ASSERT_FALSE(row.at("device_ms").is_null()) << row;
    const auto allocs = row.at("device_allocs").get<double>();
    const auto frees = row.at("device_frees").get<double>();
    if (row.at("policy") == "nocache") {  // one segment per allocation, each freed: 15 MiB
      EXPECT_EQ(allocs, 3);
      EXPECT_EQ(frees, 3);
      EXPECT_DOUBLE_EQ(row.at("device_ms").get<double>(), (3 * 1000 + 3 * 300 + 2 * 15) / 1e6);
    }
    EXPECT_GT(allocs, 0) << row;
  }
  // The replay's own JSON is a model file too.
  const fs::path again = temp("again.json");
  write(again, priced.dump());
  EXPECT_EQ(replay(again.string()).at("cost_model").at("fields"),
            priced.at("cost_model").at("fields"));
}

TEST_F(Cli, CostModelErrorsNameTheModelOrTheField) {
  const fs::path csv = lifetimes("ok.csv", {1024, 2048});
  const auto refused = [&](const std::string& model, const std::string& said) {
    const Outcome o = run("replay -q --cost-model " + quote(model) + " " + quote(csv.string()));
    EXPECT_EQ(o.code, 2) << model << "\n" << o.err;
    EXPECT_NE(o.err.find(said), std::string::npos) << model << "\n" << o.err;
  };
  refused("b200", "'b200' is neither a model (h200, a100) nor a readable file");
  const auto file = [&](const std::string& name, const std::string& text) {
    write(temp(name), text);
    return temp(name).string();
  };
  refused(file("unknown.json", R"({"create_ns": 1, "bogus_ns": 2})"),
          "unknown cost model field 'bogus_ns'");
  refused(file("negative.json", R"({"unmap_ns": -1})"), "'unmap_ns' needs a time of 0 ns or more");
  refused(file("text.json", R"({"map_ns": "fast"})"), "'map_ns' needs a number of ns");
  refused(file("broken.json", R"({"map_ns": )"), "not valid JSON");
  refused(file("array.json", "[1, 2]"), "needs a JSON object of the model's fields");
  // The old flag is gone.
  EXPECT_EQ(run("replay -q --handle-create-us 7.6 " + quote(csv.string())).code, 2);
}

TEST_F(Cli, JsonToStdoutHasNoTableAndNoProgress) {
  const fs::path csv = lifetimes("small.csv", {1000, 3000, 5000, 7000});
  const Outcome o = run("replay --json - --min-capacity " + quote(csv.string()));
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.err.find('\r'), std::string::npos);
  const json doc = json::parse(o.out);  // the whole of stdout is the document
  ASSERT_EQ(doc.at("results").size(), 3u);
  for (const json& row : doc.at("results")) {
    EXPECT_EQ(row.at("peak_live").get<std::uint64_t>(), 12000u);  // 5000 + 7000
    ASSERT_FALSE(row.at("min_capacity").is_null()) << row;
    EXPECT_GE(row.at("min_capacity").get<std::uint64_t>(), 12000u);
    EXPECT_EQ(row.at("min_capacity").get<std::uint64_t>() % (2u << 20), 0u);
  }
}

/// peak_live of every shared trace, from ../shared/traces/README.md.
std::map<std::string, std::uint64_t> readme_peak_live() {
  std::map<std::string, std::uint64_t> peaks;
  for (const auto& figures : cistern::testing::reference_figures())
    peaks[figures.path] = figures.peak_live;
  return peaks;
}

TEST_F(Cli, PeakLiveMatchesTheReadmeForEverySharedTrace) {
  REQUIRE_TRACES();
  const std::map<std::string, std::uint64_t> expected = readme_peak_live();
  std::string files;
  for (const auto& [name, peak] : expected) files += " " + quote(trace(name));
  const Outcome o = run("replay --policy nocache --json -" + files);
  ASSERT_EQ(o.code, 0) << o.err;
  const json doc = json::parse(o.out);
  std::map<std::string, std::uint64_t> seen;
  for (const json& row : doc.at("results")) {
    if (row.at("policy") != "nocache") continue;
    const std::string path = row.at("trace");
    const std::string name = path.substr(path.find("/traces/") + 8);
    seen[name] = row.at("peak_live").get<std::uint64_t>();
  }
  EXPECT_EQ(seen, expected);
}

TEST_F(Cli, ScaleMultipliesLifetimeSizes) {
  REQUIRE_TRACES();
  const Outcome o = run("replay --policy nocache --scale 1024 --json - " +
                        quote(trace("minimalloc/example.input.12.csv")));
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(json::parse(o.out).at("results").at(0).at("peak_live"), 12 * 1024);
  EXPECT_EQ(run("replay --scale 2 " + quote(trace("pytorch/DeComFL/memory.pickle.gz"))).code, 3);
}

TEST_F(Cli, WarmStartIsForSnapshotsOnly) {
  REQUIRE_TRACES();
  const Outcome warm =
      run("replay --start warm --policy torch --json - " +
          quote(trace("pytorch/cs336_Wedsonlin/medium_ctx128_inference.pickle.gz")));
  ASSERT_EQ(warm.code, 0) << warm.err;
  const json doc = json::parse(warm.out);
  const json* torch = find_row(doc, "torch");
  ASSERT_NE(torch, nullptr);
  EXPECT_EQ(torch->at("start"), "warm");
  // A lifetime list has no recorded cache; nocache cannot start from one.
  EXPECT_EQ(run("replay --start warm --policy torch " + quote(trace("somas/tiny_bert.csv"))).code,
            2);
  const Outcome nocache =
      run("replay --start warm --policy nocache " +
          quote(trace("pytorch/cs336_Wedsonlin/medium_ctx128_inference.pickle.gz")));
  EXPECT_EQ(nocache.code, 2) << nocache.err;
  EXPECT_NE(nocache.err.find("nocache"), std::string::npos) << nocache.err;
}

TEST_F(Cli, DeviceChoosesTheDeviceOfAMultiDeviceFormat) {
  REQUIRE_TRACES();
  const std::string kineto = quote(trace("kineto/df_index_resolver.json.gz"));
  const Outcome one = run("replay --policy nocache --device 1 --json - " + kineto);
  ASSERT_EQ(one.code, 0) << one.err;
  const json doc = json::parse(one.out);
  for (const json& row : doc.at("results")) EXPECT_EQ(row.at("device"), 1);
  const Outcome zero = run("replay --device 0 " + kineto);
  EXPECT_EQ(zero.code, 3);
  EXPECT_NE(zero.err.find("device"), std::string::npos) << zero.err;
}

// --- info ---------------------------------------------------------------------------------------

// `cistern info --engine` makes the engine's first growth on a device and says whether it runs
// there: on the simulated device with the defaults (far from the limit, one 20 MiB page handle for
// the 2 MiB probe, as expandable segments map it), off with vmm:False, and exit 5 where --backend
// cuda finds no GPU.
TEST_F(Cli, InfoEngineSaysWhetherTheEngineRunsOnADevice) {
  const Outcome o = run("info --engine --capacity 8GiB");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("virtual memory            yes"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("on: its first growth created 1 handle(s) and mapped 10 granule(s)"),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("num_vmm_fallbacks         0"), std::string::npos) << o.out;
  const Outcome j = run("info --engine --json");
  ASSERT_EQ(j.code, 0) << j.err;
  const json doc = json::parse(j.out);
  EXPECT_EQ(doc["device"], "sim:0 (80.00 GiB)");
  EXPECT_EQ(doc["virtual_memory"], true);
  EXPECT_EQ(doc["engine"], true);
  EXPECT_EQ(doc["first_growth"]["handles_created"], 1);
  EXPECT_EQ(run("info").code, 2);
  const Outcome gpu = run("info --engine --backend cuda");
  if (gpu.code == 0) GTEST_SKIP() << "this machine has a GPU: " << gpu.out;
  EXPECT_EQ(gpu.code, 5) << gpu.err;
  EXPECT_NE(gpu.err.find("no CUDA device can be used"), std::string::npos) << gpu.err;
}

TEST_F(Cli, InfoDescribesASnapshot) {
  REQUIRE_TRACES();
  const Outcome o = run("info " + quote(trace("pytorch/cs336_MAGMA27/memory_snapshot.pickle.gz")));
  ASSERT_EQ(o.code, 0) << o.err;
  for (const char* word :
       {"pytorch", "devices", "streams", "events", "1721 alloc", "live before the window",
        "13923997700", "recorded peak reserved", "14180941824", "allocation sizes", "#"})
    EXPECT_NE(o.out.find(word), std::string::npos) << word << "\n" << o.out;
  const Outcome j = run("info --json " + quote(trace("kineto/df_index_resolver.json.gz")));
  ASSERT_EQ(j.code, 0) << j.err;
  const json doc = json::parse(j.out);
  EXPECT_EQ(doc.at("format"), "kineto");
  EXPECT_EQ(doc.at("device"), 1);
  EXPECT_EQ(doc.at("allocs"), 13385);
  EXPECT_EQ(doc.at("peak_live").get<std::uint64_t>(), 6629508096u);
  EXPECT_EQ(doc.at("recorded_peak_reserved").get<std::uint64_t>(), 12782141440u);
  EXPECT_FALSE(doc.at("size_histogram").empty());
}

// --- convert ------------------------------------------------------------------------------------

/// The figures of a replay that must survive a conversion, by policy.
std::map<std::string, json> figures(const json& doc) {
  std::map<std::string, json> out;
  for (const json& row : doc.at("results")) {
    if (row.at("policy") == "recorded") continue;
    out[row.at("policy")] = {row.at("peak_live"), row.at("peak_reserved"), row.at("ooms"),
                             row.at("device_allocs"), row.at("device_frees")};
  }
  return out;
}

TEST_F(Cli, ConvertToNativeAndBackReplaysTheSame) {
  REQUIRE_TRACES();
  for (const std::string name : {"pytorch/cs336_Wedsonlin/medium_ctx256_inference.pickle.gz",
                                 "kineto/df_index_resolver.json.gz", "somas/resnet50.csv"}) {
    const fs::path native = temp("converted.trace");
    const Outcome c = run("convert " + quote(trace(name)) + " " + quote(native.string()));
    ASSERT_EQ(c.code, 0) << name << ": " << c.err;
    const Outcome a = run("replay --json - " + quote(trace(name)));
    const Outcome b = run("replay --json - " + quote(native.string()));
    ASSERT_EQ(a.code, 0) << a.err;
    ASSERT_EQ(b.code, 0) << b.err;
    EXPECT_EQ(figures(json::parse(a.out)), figures(json::parse(b.out))) << name;
    EXPECT_EQ(slurp(native).rfind("# cistern-trace", 0), 0u);
  }
}

TEST_F(Cli, SnapshotPerPolicyReadsBackWithTheReplaysFigures) {
  const fs::path csv = lifetimes("t.csv", {1000, 3 << 20, 512, 25 << 20, 7000, 1 << 20});
  const fs::path snapshot = temp("s.pickle");
  const Outcome r = run("replay --policy cistern,torch --json - --snapshot " +
                        quote(snapshot.string()) + " " + quote(csv.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const json doc = json::parse(r.out);
  for (const std::string policy : {"cistern", "torch"}) {
    const fs::path written = temp("s." + policy + ".pickle");
    ASSERT_TRUE(fs::exists(written)) << written;
    const Outcome info = run("info --json " + quote(written.string()));
    ASSERT_EQ(info.code, 0) << info.err;
    const json i = json::parse(info.out);
    const json* row = find_row(doc, policy);
    ASSERT_NE(row, nullptr) << policy;
    EXPECT_EQ(i.at("format"), "pytorch");
    EXPECT_EQ(i.at("allocs"), 6);
    EXPECT_EQ(i.at("peak_live"), row->at("peak_live")) << policy;
    if (policy == "cistern") {
      // The snapshot shows the engine's mapped pages, as PyTorch shows expandable segments; the
      // replay's reserved memory also counts pages of its handles not mapped yet.
      EXPECT_LE(i.at("recorded_peak_reserved"), row->at("peak_reserved")) << policy;
      EXPECT_GE(i.at("recorded_peak_reserved"), row->at("peak_live")) << policy;
    } else {
      EXPECT_EQ(i.at("recorded_peak_reserved"), row->at("peak_reserved")) << policy;
    }
  }
  EXPECT_FALSE(fs::exists(snapshot)) << "with several policies each file names its policy";
}

TEST_F(Cli, TorchReplaysASnapshotWithItsRecordedSettingsAndSaysSo) {
  // A snapshot of a run with expandable segments, written by `replay --snapshot`.
  const fs::path csv = lifetimes("t.csv", {1000, 3 << 20, 512, 25 << 20, 7000, 1 << 20, 70 << 20});
  const fs::path snapshot = temp("s.pickle");
  ASSERT_EQ(run("replay -q --policy torch:expandable_segments=true --snapshot " +
                quote(snapshot.string()) + " " + quote(csv.string()))
                .code,
            0);
  // Plain torch takes expandable_segments:True from it and reproduces the recorded peak.
  const Outcome warm =
      run("replay --start warm --policy torch,torch:expandable_segments=false "
          "--json - " +
          quote(snapshot.string()));
  ASSERT_EQ(warm.code, 0) << warm.err;
  const json doc = json::parse(warm.out);
  const json* recorded = find_row(doc, "recorded");
  const json* plain = find_row(doc, "torch");
  const json* given = find_row(doc, "torch:expandable_segments=false");
  ASSERT_TRUE(recorded != nullptr && plain != nullptr && given != nullptr) << warm.out;
  EXPECT_TRUE(recorded->at("settings").is_null());
  EXPECT_EQ(plain->at("peak_reserved"), recorded->at("peak_reserved"));
  EXPECT_GT(plain->at("maps").get<int>(), 0);
  const json& settings = plain->at("settings");
  EXPECT_EQ(settings.at("expandable_segments").at("value"), "True");
  EXPECT_EQ(settings.at("expandable_segments").at("source"), "recorded");
  EXPECT_EQ(settings.at("max_split_size_mb").at("value"), "unlimited");
  EXPECT_EQ(settings.at("max_split_size_mb").at("source"), "recorded");
  EXPECT_EQ(given->at("settings").at("expandable_segments").at("value"), "False");
  EXPECT_EQ(given->at("settings").at("expandable_segments").at("source"), "given");
  EXPECT_EQ(given->at("maps"), 0);
  // The table and the HTML report say so under each torch row.
  const Outcome table = run("replay --start warm --policy torch,torch:expandable_segments=false " +
                            quote(snapshot.string()));
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("settings: expandable_segments:True (recorded)"), std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("settings: expandable_segments:False (given)"), std::string::npos)
      << table.out;
  const Outcome html =
      run("replay --start warm --policy torch --html - " + quote(snapshot.string()));
  ASSERT_EQ(html.code, 0) << html.err;
  EXPECT_NE(html.out.find("settings: expandable_segments:True (recorded)"), std::string::npos);
  // A trace that records no settings: PyTorch's defaults, and no settings line.
  const Outcome plain_csv = run("replay --policy torch,cistern --json - " + quote(csv.string()));
  ASSERT_EQ(plain_csv.code, 0) << plain_csv.err;
  const json defaults = json::parse(plain_csv.out);
  EXPECT_EQ(find_row(defaults, "torch")->at("settings").at("expandable_segments").at("source"),
            "default");
  EXPECT_TRUE(find_row(defaults, "cistern")->at("settings").is_null());
  EXPECT_EQ(run("replay --policy torch " + quote(csv.string())).out.find("settings:"),
            std::string::npos);
}

TEST_F(Cli, ConvertToLifetimesKeepsPeakLive) {
  REQUIRE_TRACES();
  const std::string name = "pytorch/DeComFL/memory.pickle.gz";
  const fs::path csv = temp("lifetimes.csv");
  ASSERT_EQ(run("convert --to lifetimes " + quote(trace(name)) + " " + quote(csv.string())).code,
            0);
  const Outcome o = run("replay --policy nocache --json - " + quote(csv.string()));
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(json::parse(o.out).at("results").at(0).at("peak_live").get<std::uint64_t>(),
            1783664516u);
}

// --- HTML ---------------------------------------------------------------------------------------

TEST_F(Cli, HtmlReportIsSelfContainedAndCarriesTheData) {
  REQUIRE_TRACES();
  const fs::path html = temp("report.html");
  const Outcome o = run("replay -q --html " + quote(html.string()) + " " +
                        quote(trace("pytorch/cs336_Wedsonlin/medium_ctx128_training.pickle.gz")) +
                        " " + quote(trace("somas/tiny_bert.csv")));
  ASSERT_EQ(o.code, 0) << o.err;
  const std::string page = slurp(html);
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(page.find("http://"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  EXPECT_EQ(page.find("<link"), std::string::npos);
  EXPECT_EQ(page.find(" src="), std::string::npos);
  EXPECT_EQ(page.find("@import"), std::string::npos);
  EXPECT_EQ(page.find("url("), std::string::npos);
  for (const char* word : {"medium_ctx128_training.pickle.gz", "tiny_bert.csv", "<svg", "<polyline",
                           "timeline-0", "timeline-1", "Segment map", "recorded", "cistern",
                           "torch", "nocache", "6.53 GiB", "7013335044"})
    EXPECT_NE(page.find(word), std::string::npos) << word;
  EXPECT_LT(page.size(), 4u << 20);
}

std::string fmt_stacks(std::size_t stacks) {
  return "call stacks               " + std::to_string(stacks) + " distinct, for ";
}

/// The JSON a report embeds under `id` (a <script type="application/json"> element).
json embedded_json(const std::string& page, const std::string& id) {
  const std::string open = "<script type=\"application/json\" id=\"" + id + "\">";
  const std::size_t begin = page.find(open);
  if (begin == std::string::npos) return nullptr;
  const std::size_t from = begin + open.size();
  return json::parse(page.substr(from, page.find("</script>", from) - from));
}

TEST_F(Cli, HtmlReportNamesTheLargestBlocksAtEachPeakWithTheirFrames) {
  REQUIRE_TRACES();
  const std::string path = trace("pytorch/DeComFL/memory.pickle.gz");
  const fs::path html = temp("where.html");
  const Outcome o =
      run("replay -q -p cistern,torch --html " + quote(html.string()) + " " + quote(path));
  ASSERT_EQ(o.code, 0) << o.err;
  const std::string page = slurp(html);
  EXPECT_NE(page.find("Where the memory went"), std::string::npos);
  EXPECT_NE(page.find("type=\"range\""), std::string::npos);
  const json data = embedded_json(page, "where-0");
  ASSERT_TRUE(data.is_object());
  const json& moments = data.at("moments");
  const json timeline = embedded_json(page, "timeline-0");
  ASSERT_TRUE(timeline.is_object());
  EXPECT_GT(moments.size(), 10u) << "a moment per timeline point";
  EXPECT_EQ(moments.size(), timeline.at("xs").at(0).size());

  // The expected moment, from the trace itself: the allocations live after the first policy's
  // peak, largest first, and the frames of the largest.
  const cistern::trace::Trace t = cistern::trace::read_trace(path);
  const json& recorded = data.at("policies").at(0);
  ASSERT_TRUE(recorded.at("peakEvent").is_number());
  const auto peak = recorded.at("peakEvent").get<std::size_t>();
  std::map<std::uint64_t, std::uint64_t> live;  // id -> size
  for (const cistern::trace::LiveBlock& b : t.live_before) live[b.id] = b.size;
  for (std::size_t i = 0; i <= peak; ++i) {
    const cistern::trace::Event& e = t.events[i];
    if (e.op == cistern::trace::Op::alloc) live[e.id] = e.size;
    if (e.op == cistern::trace::Op::free) live.erase(e.id);
  }
  std::uint64_t largest = 0, bytes = 0;
  for (const auto& [id, size] : live) largest = std::max(largest, size), bytes += size;
  const json* moment = nullptr;
  for (const json& m : moments)
    if (m.at("event") == peak) moment = &m;
  ASSERT_NE(moment, nullptr);
  EXPECT_EQ(moment->at("live").get<std::uint64_t>(), bytes);
  const json& top = moment->at("largest").at(0);
  EXPECT_EQ(top.at(0).get<std::uint64_t>(), largest);
  const auto id = top.at(1).get<std::uint64_t>();
  EXPECT_EQ(live.at(id), largest);
  // Its frames, innermost first, are the trace's for that allocation, and the page names them.
  ASSERT_GE(top.at(2).get<int>(), 0) << "DeComFL's allocations have frames";
  const json& frames = data.at("stacks").at(top.at(2).get<std::size_t>());
  const std::vector<std::uint32_t>& expected = t.stacks.stack(t.stack_of(id));
  ASSERT_EQ(frames.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const cistern::StackFrame& f = t.stacks.frame(expected[i]);
    EXPECT_EQ(frames[i], json::array({f.filename, f.line, f.name}));
  }
  EXPECT_NE(page.find("<b>" + t.stacks.frame(expected[0]).name + "</b>"), std::string::npos);
  EXPECT_EQ(page.find("http://"), std::string::npos);
}

TEST_F(Cli, InfoCountsTheCallStacks) {
  REQUIRE_TRACES();
  const std::string path = trace("pytorch/DeComFL/memory.pickle.gz");
  const cistern::trace::Trace t = cistern::trace::read_trace(path);
  const Outcome text = run("info " + quote(path));
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find(fmt_stacks(t.stacks.size() - 1)), std::string::npos) << text.out;
  const json doc = json::parse(run("info --json " + quote(path)).out);
  EXPECT_EQ(doc.at("stacks"), t.stacks.size() - 1);
  EXPECT_EQ(doc.at("allocations_with_stacks"), t.live_before.size() + t.allocations());
}

TEST_F(Cli, ReplaySnapshotKeepsTheInputsFrames) {
  REQUIRE_TRACES();
  const std::string path = trace("pytorch/DeComFL/memory.pickle.gz");
  const fs::path out = temp("frames.pickle");
  const Outcome o =
      run("replay -q -p cistern --snapshot " + quote(out.string()) + " " + quote(path));
  ASSERT_EQ(o.code, 0) << o.err;
  const auto frames_of = [](cistern::trace::pickle::Value list) {
    std::vector<std::tuple<std::string, std::int64_t, std::string>> frames;
    for (const cistern::trace::pickle::Value f : list)
      frames.emplace_back(f.at("filename").as_string(), f.at("line").as_int(),
                          f.at("name").as_string());
    return frames;
  };
  const cistern::trace::pickle::Document input = cistern::trace::pickle::read_file(path);
  const cistern::trace::pickle::Document written = cistern::trace::pickle::read_file(out.string());
  std::vector<std::vector<std::tuple<std::string, std::int64_t, std::string>>> in, back;
  for (const cistern::trace::pickle::Value e : input.root().at("device_traces")[0])
    if (e.at("action").as_string() == "alloc") in.push_back(frames_of(e.at("frames")));
  for (const cistern::trace::pickle::Value e : written.root().at("device_traces")[0])
    if (e.at("action").as_string() == "alloc") back.push_back(frames_of(e.at("frames")));
  // The replay allocates the blocks live before the window first, then the window's, in order.
  const std::size_t before = cistern::trace::read_trace(path).live_before.size();
  ASSERT_EQ(back.size(), before + in.size());
  EXPECT_TRUE(std::equal(in.begin(), in.end(), back.begin() + static_cast<std::ptrdiff_t>(before)));
  EXPECT_FALSE(in.front().empty());
}

// --- --backend cuda ----------------------------------------------------------------------------

TEST_F(Cli, BackendCudaWithoutAGpuExitsFiveAndSaysWhy) {
  const fs::path csv = lifetimes("small.csv", {1000, 3u << 20, 512});
  const Outcome o = run("replay --backend cuda --touch --json - " + quote(csv.string()));
  if (o.code == 0) {  // a GPU is here: the JSON names it and the backend
    const json doc = json::parse(o.out);
    EXPECT_EQ(doc.at("backend"), "cuda");
    EXPECT_EQ(doc.at("touch"), true);
    EXPECT_EQ(doc.at("results").size(), 3u);
    return;
  }
  EXPECT_EQ(o.code, 5) << o.err;
  EXPECT_TRUE(o.err.find("cistern: no CUDA device can be used") != std::string::npos ||
              o.err.find("built without the CUDA toolkit") != std::string::npos)
      << o.err;
  EXPECT_EQ(o.out, "");
}

TEST_F(Cli, BackendCudaRefusesWhatOnlyTheSimulatedDeviceCanDo) {
  const fs::path csv = lifetimes("small.csv", {1000, 2000});
  for (const char* flags : {"--backend cuda --min-capacity", "--backend cuda --html x.html",
                            "--backend cuda --start warm", "--touch"}) {
    const Outcome o = run(std::string("replay ") + flags + " " + quote(csv.string()));
    EXPECT_EQ(o.code, 2) << flags << "\n" << o.err;
  }
}

// --- several devices, advise --------------------------------------------------------------------

/// A snapshot of devices 0 and 1, each allocating 1000 bytes in a new small segment.
std::string two_device_snapshot() {
  std::vector<cistern::DeviceRecord> devices;
  for (int d = 0; d < 2; ++d) {
    const std::uintptr_t base = 0x7f0000000000 + (static_cast<std::uintptr_t>(d) << 36);
    cistern::DeviceRecord record;
    record.device = d;
    cistern::HistoryEntry segment, alloc;
    segment.action = cistern::HistoryEntry::Action::segment_alloc;
    segment.addr = base;
    segment.size = 2u << 20;
    alloc.addr = base;
    alloc.size = 1000;
    record.history = {segment, alloc};
    cistern::SegmentInfo held;
    held.device = d;
    held.address = base;
    held.total_size = 2u << 20;
    held.blocks = {{base, 1024, 1000, cistern::BlockState::active_allocated},
                   {base + 1024, (2u << 20) - 1024, 0, cistern::BlockState::inactive}};
    record.snapshot.segments = {held};
    devices.push_back(record);
  }
  return cistern::pytorch_snapshot_pickle(devices, cistern::Config{});
}

TEST_F(Cli, ReplayGivesOneRowPerDeviceUnlessOneIsChosen) {
  write(temp("two.pickle"), two_device_snapshot());
  const std::string file = quote(temp("two.pickle").string());
  const Outcome all = run("replay -p torch --start warm --json - " + file);
  ASSERT_EQ(all.code, 0) << all.err;
  std::map<int, int> rows;
  const json doc = json::parse(all.out);
  for (const json& row : doc.at("results")) {
    ++rows[row.at("device").get<int>()];
    EXPECT_EQ(row.at("peak_reserved").get<std::uint64_t>(), 2u << 20) << row;
  }
  EXPECT_EQ(rows, (std::map<int, int>{{0, 2}, {1, 2}}));  // recorded and torch, per device
  const Outcome one = run("replay -p torch --device 1 --json - " + file);
  ASSERT_EQ(one.code, 0) << one.err;
  const json chosen = json::parse(one.out);
  for (const json& row : chosen.at("results")) EXPECT_EQ(row.at("device"), 1);
}

TEST_F(Cli, InfoAndReplaySayWhatCannotBeReproduced) {
  std::vector<cistern::DeviceRecord> devices(1);
  cistern::HistoryEntry oom;
  oom.action = cistern::HistoryEntry::Action::oom;
  oom.size = 64u << 20;
  devices[0].history = {oom};
  write(temp("oom.pickle"), cistern::pytorch_snapshot_pickle(devices, cistern::Config{}));
  const std::string file = quote(temp("oom.pickle").string());
  const Outcome info = run("info " + file);
  ASSERT_EQ(info.code, 0) << info.err;
  EXPECT_NE(info.out.find("not reproducible exactly: 1 allocation(s) failed"), std::string::npos)
      << info.out;
  const Outcome replay = run("replay -p torch " + file);
  ASSERT_EQ(replay.code, 0) << replay.err;
  EXPECT_NE(replay.err.find("note: "), std::string::npos) << replay.err;
}

TEST_F(Cli, AdviseFindsTheBestConfigurationAndWritesJsonAndHtml) {
  // A 100 MiB buffer freed, then a 12 MiB one that outlives a 95 MiB one (test_advise.cpp works
  // the figures out): PyTorch's defaults need 196 MiB, max_split_size_mb:95 108 MiB.
  const std::uint64_t mib = 1u << 20;
  write(temp("pin.csv"), "id,lower,upper,size\n0,0,1," + std::to_string(100 * mib) + "\n1,1,4," +
                             std::to_string(12 * mib) + "\n2,2,3," + std::to_string(95 * mib) +
                             "\n");
  const fs::path out = temp("advice.json"), html = temp("advice.html");
  const Outcome o = run("advise --json " + quote(out.string()) + " --html " + quote(html.string()) +
                        " " + quote(temp("pin.csv").string()));
  ASSERT_EQ(o.code, 0) << o.err;
  // The answer, under the variable PyTorch reads now and, as a comment, the older one.
  EXPECT_NE(o.out.find("  export PYTORCH_ALLOC_CONF='max_split_size_mb:95'\n"
                       "  # PyTorch 2.9 and earlier read only PYTORCH_CUDA_ALLOC_CONF; where it is "
                       "set, it wins:\n"
                       "  # export PYTORCH_CUDA_ALLOC_CONF='max_split_size_mb:95'\n"),
            std::string::npos)
      << o.out;
  const json doc = json::parse(slurp(out));
  ASSERT_EQ(doc.at("results").size(), 1u);
  const json& r = doc.at("results")[0];
  EXPECT_EQ(r.at("device"), 0);
  EXPECT_EQ(r.at("baseline").at("config"), "");
  EXPECT_EQ(r.at("baseline").at("min_capacity").get<std::uint64_t>(), 196 * mib);
  EXPECT_EQ(r.at("best").at("config"), "max_split_size_mb:95");
  EXPECT_EQ(r.at("best").at("min_capacity").get<std::uint64_t>(), 108 * mib);
  EXPECT_EQ(r.at("best").at("device_allocs"), 2);
  EXPECT_EQ(r.at("variables"), json::parse(R"({"PYTORCH_ALLOC_CONF": "max_split_size_mb:95",
                                               "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:95"})"));
  ASSERT_GT(r.at("candidates").size(), 10u);
  for (const char* key : {"config", "min_capacity", "device_allocs", "device_maps", "device_ms"})
    EXPECT_TRUE(r.at("candidates")[0].contains(key)) << key;
  bool expandable = false;
  for (const json& c : r.at("candidates"))
    expandable |= c.at("config") == "expandable_segments:True";
  EXPECT_TRUE(expandable);
  // cistern's figure is that of a replay of cistern's defaults, and its saving is against the
  // best PyTorch setting.
  const Outcome replay =
      run("replay -p cistern --min-capacity --json - " + quote(temp("pin.csv").string()));
  ASSERT_EQ(replay.code, 0) << replay.err;
  std::uint64_t replayed = 0;
  const json replay_doc = json::parse(replay.out);
  for (const json& row : replay_doc.at("results"))
    if (row.at("policy") == "cistern") replayed = row.at("min_capacity").get<std::uint64_t>();
  ASSERT_GT(replayed, 0u) << replay.out;
  const json& c = r.at("cistern");
  EXPECT_EQ(c.at("policy"), "cistern");
  EXPECT_EQ(c.at("min_capacity").get<std::uint64_t>(), replayed);
  for (const char* key : {"device_allocs", "device_maps", "device_ms"})
    EXPECT_TRUE(c.contains(key)) << key;
  EXPECT_DOUBLE_EQ(c.at("saving_vs_best").get<double>(),
                   (108.0 * mib - static_cast<double>(replayed)) / (108.0 * mib));
  // The table has cistern's row and the comparison with the best setting.
  EXPECT_NE(o.out.find("  cistern (its defaults) needs "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find(" the best PyTorch setting (108.00 MiB)\n"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("(cistern's own allocator, its defaults)"), std::string::npos) << o.out;
  const std::string page = slurp(html);
  EXPECT_NE(page.find("<th>PYTORCH_ALLOC_CONF</th>"), std::string::npos);
  EXPECT_NE(page.find("export PYTORCH_ALLOC_CONF=&#39;max_split_size_mb:95&#39;"),
            std::string::npos);
  EXPECT_NE(page.find("max_split_size_mb:95"), std::string::npos);
}

TEST_F(Cli, AdviseSaysToLeaveTheVariablesUnsetWhenTheDefaultsAreBest) {
  // One 1000-byte buffer: every configuration needs one 2 MiB small segment, and the defaults
  // win the tie (the shortest string).
  write(temp("one.csv"), "id,lower,upper,size\n0,0,1,1000\n");
  const Outcome o = run("advise --json - " + quote(temp("one.csv").string()));
  ASSERT_EQ(o.code, 0) << o.err;
  const json r = json::parse(o.out).at("results")[0];
  EXPECT_EQ(r.at("best").at("config"), "");
  EXPECT_EQ(r.at("best").at("min_capacity"), 2u << 20);
  EXPECT_EQ(r.at("variables").at("PYTORCH_ALLOC_CONF"), "");
  // Equal figures share a rank ("1, 1, ..., 10, 10, ..., 19"): 9 configurations take one 2 MiB
  // segment, 9 map one page instead (expandable segments), 5 set a memory fraction.
  std::map<std::uint64_t, std::size_t> ranks;
  for (const json& c : r.at("candidates")) ++ranks[c.at("rank").get<std::uint64_t>()];
  EXPECT_EQ(ranks, (std::map<std::uint64_t, std::size_t>{{1, 9}, {10, 9}, {19, 5}}));
  const Outcome table = run("advise " + quote(temp("one.csv").string()));
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("        1     2.00 MiB    0.00%          1      0       0.05  "
                           "roundup_power2_divisions:16\n"),
            std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("       10     2.00 MiB    0.00%          0      1       0.05  "
                           "expandable_segments:True\n"),
            std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("  PyTorch's defaults need the least: leave PYTORCH_ALLOC_CONF and "
                           "PYTORCH_CUDA_ALLOC_CONF unset\n"),
            std::string::npos)
      << table.out;
  EXPECT_EQ(table.out.find("export "), std::string::npos) << table.out;
}

}  // namespace

// --- cistern plan -----------------------------------------------------------------------------

namespace {

TEST_F(Cli, PlanWritesJsonRowsWithTheCapacityOfAMinimallocName) {
  const fs::path named = temp("example.input.12.csv");
  write(named, "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n");
  const fs::path plain = lifetimes("plain.csv", {1000, 3000, 5000});
  const Outcome o =
      run("plan --time-limit 1 --json - " + quote(named.string()) + " " + quote(plain.string()));
  ASSERT_EQ(o.code, 0) << o.err;
  const json doc = json::parse(o.out);
  ASSERT_EQ(doc.at("results").size(), 2u);
  const json& first = doc.at("results")[0];
  for (const char* key : {"trace", "arena", "peak_live", "capacity", "seconds"})
    EXPECT_TRUE(first.contains(key)) << key;
  EXPECT_EQ(first.at("arena"), 12);
  EXPECT_EQ(first.at("peak_live"), 12);
  EXPECT_EQ(first.at("capacity"), 12);
  EXPECT_EQ(first.at("optimal"), true);
  const json& second = doc.at("results")[1];
  EXPECT_TRUE(second.at("capacity").is_null());
  EXPECT_EQ(second.at("peak_live"), 8000);  // buffers 1 and 2 live together
  EXPECT_EQ(second.at("arena"), 8000);
}

TEST_F(Cli, PlanOutWritesTheDocumentedFormat) {
  const fs::path csv = lifetimes("l.csv", {1000, 3000});
  const fs::path out = temp("l.plan");
  const Outcome o = run("plan --out " + quote(out.string()) + " " + quote(csv.string()));
  ASSERT_EQ(o.code, 0) << o.err;
  const std::string text = slurp(out);
  EXPECT_EQ(text, "# cistern-plan 1\n# trace " + csv.string() +
                      "\n# buffers 2 arena 4000 peak_live 4000 alignment 1 optimal\n"
                      "id,lower,upper,size,offset\n0,0,2,1000,3000\n1,1,3,3000,0\n");
  EXPECT_NE(o.out.find("l.csv"), std::string::npos) << o.out;
}

TEST_F(Cli, PlanRefusesBadFlags) {
  const fs::path csv = lifetimes("l.csv", {1000, 3000});
  EXPECT_EQ(run("plan --out x.plan " + quote(csv.string()) + " " + quote(csv.string())).code, 2);
  EXPECT_EQ(run("plan --alignment 3 " + quote(csv.string())).code, 3);
  EXPECT_EQ(run("plan --capacity lots " + quote(csv.string())).code, 2);
  EXPECT_EQ(run("plan " + quote(temp("missing.csv").string())).code, 3);
}

}  // namespace
