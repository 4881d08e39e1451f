#include "common/config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "common/main_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, test_port, 0, "a port");
ABSL_FLAG(bool, test_switch, false, "a switch");
ABSL_FLAG(std::string, test_name, "x", "a name");

namespace adaps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(CheckPort, AcceptsZeroTo65535) {
  EXPECT_TRUE(CheckPort("port", 0).ok());
  EXPECT_TRUE(CheckPort("port", 5510).ok());
  EXPECT_TRUE(CheckPort("port", 65535).ok());
}

TEST(CheckPort, RejectsNegativeAndTooLargeNamingTheFlag) {
  // Once: --port=-1 bound 65535 and --port=70000 bound 4464.
  for (int bad : {-1, 65536, 70000}) {
    const absl::Status s = CheckPort("port", bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("--port=" + std::to_string(bad)));
  }
}

TEST(CheckPositive, ZeroAndNegativeAreErrorsForEveryType) {
  EXPECT_TRUE(CheckPositive("bin_size", 1).ok());
  EXPECT_TRUE(CheckPositive("lr", 0.01).ok());
  EXPECT_TRUE(CheckPositive("split_threshold", uint64_t{1}).ok());
  EXPECT_THAT(std::string(CheckPositive("bin_size", 0).message()), HasSubstr("--bin_size=0"));
  EXPECT_FALSE(CheckPositive("heartbeat_ms", -5).ok());
  EXPECT_FALSE(CheckPositive("lr", 0.0).ok());
  EXPECT_FALSE(CheckPositive("split_threshold", uint64_t{0}).ok());
}

TEST(CheckNonNegative, ZeroIsFineNegativeIsNot) {
  EXPECT_TRUE(CheckNonNegative("max_steps", 0).ok());
  EXPECT_THAT(std::string(CheckNonNegative("max_steps", -1).message()),
              HasSubstr("--max_steps=-1"));
}

TEST(CheckFraction, OnlyZeroToOneExcludingZero) {
  EXPECT_TRUE(CheckFraction("topk_fraction", 1.0).ok());
  EXPECT_TRUE(CheckFraction("topk_fraction", 0.001).ok());
  EXPECT_FALSE(CheckFraction("topk_fraction", 0.0).ok());
  EXPECT_FALSE(CheckFraction("topk_fraction", 1.5).ok());
}

TEST(ResolveListenHost, AddressesStarAndInterfacesComeBackUnchanged) {
  for (const char* host : {"127.0.0.1", "0.0.0.0", "*", "::1", "lo"}) {
    auto got = ResolveListenHost("host", host);
    ASSERT_TRUE(got.ok()) << host << ": " << got.status();
    EXPECT_EQ(*got, host);
  }
}

TEST(ResolveListenHost, HostNameIsResolvedToAnAddress) {
  auto got = ResolveListenHost("host", "localhost");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "127.0.0.1");
}

TEST(ResolveListenHost, NonsenseNamesTheFlag) {
  // Once: ZeroMQ's "No such device", after the process had started.
  for (const char* host : {"", "256.1.1.1", "bad host!", "no-such-host.invalid"}) {
    auto got = ResolveListenHost("host", host);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << host;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr("--host="));
  }
}

TEST(CheckConnectEndpoint, NeedsTcpHostAndPort) {
  EXPECT_TRUE(CheckConnectEndpoint("scheduler", "tcp://127.0.0.1:5510").ok());
  EXPECT_TRUE(CheckConnectEndpoint("scheduler", "tcp://scheduler:5510").ok());
  EXPECT_TRUE(CheckConnectEndpoint("scheduler", "ipc:///tmp/s").ok());
  for (const char* bad : {"", "127.0.0.1:5510", "tcp://:5510", "tcp://host", "tcp://host:0",
                          "tcp://host:70000", "tcp://host:-1", "tcp://host:x"}) {
    const absl::Status s = CheckConnectEndpoint("scheduler", bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("--scheduler=")) << bad;
  }
}

TEST(CheckReadableDir, MissingDirectoryAndFileAreErrors) {
  const std::string dir = ::testing::TempDir();
  EXPECT_TRUE(CheckReadableDir("data_dir", dir).ok());
  EXPECT_THAT(std::string(CheckReadableDir("data_dir", dir + "/no-such-dir").message()),
              HasSubstr("--data_dir="));
  const std::string file = dir + "/config_test_file";
  std::ofstream(file) << "x";
  EXPECT_FALSE(CheckReadableDir("data_dir", file).ok());
  EXPECT_FALSE(CheckReadableDir("data_dir", "").ok());
  std::filesystem::remove(file);
}

TEST(FirstError, ReturnsTheFirstFailureOrOk) {
  EXPECT_TRUE(FirstError({absl::OkStatus(), absl::OkStatus()}).ok());
  const absl::Status s = FirstError(
      {absl::OkStatus(), absl::InvalidArgumentError("a"), absl::InvalidArgumentError("b")});
  EXPECT_EQ(s.message(), "a");
}

TEST(FlagsDefinedIn, ListsTheFlagsOfOneDirectoryFromTheRegistry) {
  // This file is tests/common/config_test.cc: its flags are "common"'s, absl's are not.
  EXPECT_THAT(FlagsDefinedIn("common"), ElementsAre("test_name", "test_port", "test_switch"));
  EXPECT_TRUE(FlagsDefinedIn("no_such_dir").empty());
}

std::vector<char*> Argv(std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return argv;
}

absl::Status Check(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv = Argv(args);
  return CheckCommandLine(static_cast<int>(argv.size()), argv.data(), FlagsDefinedIn("common"));
}

TEST(CheckCommandLine, AcceptsEveryFormAbslAccepts) {
  EXPECT_TRUE(Check({"--test_port=5", "-test_port=6", "--test_port", "7"}).ok());
  EXPECT_TRUE(Check({"--test_switch", "--notest_switch", "--test_switch=false"}).ok());
  EXPECT_TRUE(Check({"--test_name=a=b", "--"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "a=b");
}

TEST(CheckCommandLine, UnknownFlagsBadValuesAndStrayArgumentsAreErrors) {
  EXPECT_THAT(std::string(Check({"--bogus=1"}).message()), HasSubstr("unknown flag --bogus"));
  EXPECT_THAT(std::string(Check({"--test_port=abc"}).message()), HasSubstr("--test_port="));
  EXPECT_THAT(std::string(Check({"--test_port"}).message()), HasSubstr("needs a value"));
  EXPECT_THAT(std::string(Check({"extra"}).message()), HasSubstr("unexpected argument"));
  EXPECT_THAT(std::string(Check({"--", "extra"}).message()), HasSubstr("unexpected argument"));
  EXPECT_FALSE(Check({"--notest_port"}).ok());  // not a bool
}

TEST(HelpText, ListsTheFlagsAndExitCodesWithoutBuildPaths) {
  const std::string help = HelpText("prog", "does things.", FlagsDefinedIn("common"));
  EXPECT_THAT(help, HasSubstr("--test_port (a port); default: 0;"));
  EXPECT_THAT(help, HasSubstr("--test_name (a name); default: \"x\";"));
  EXPECT_THAT(help, HasSubstr("Exit codes: 0"));
  EXPECT_THAT(help, Not(HasSubstr(".cc")));
  EXPECT_THAT(help, Not(HasSubstr("/")));
}

TEST(LoadLayeredFlags, EnvironmentOverridesTheFileAndANamedFlagOnly) {
  const std::string path = ::testing::TempDir() + "/config_test.conf";
  std::ofstream(path) << "# comment\ntest_port = 11\ntest_name = from_file\n";
  setenv("ADAPS_TEST_PORT", "12", 1);
  std::vector<std::string> args = {"prog", "--config=" + path};
  std::vector<char*> argv = Argv(args);
  ASSERT_TRUE(LoadLayeredFlags(2, argv.data(), FlagsDefinedIn("common")).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_port), 12);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "from_file");
  setenv("ADAPS_TEST_PORT", "nope", 1);
  EXPECT_EQ(LoadLayeredFlags(2, argv.data(), FlagsDefinedIn("common")).code(),
            absl::StatusCode::kInvalidArgument);
  unsetenv("ADAPS_TEST_PORT");
  std::filesystem::remove(path);
}

// The scheduler's last messages on a slow link: what a peer that does not read leaves
// unacknowledged is counted, and nothing once it has read everything.
TEST(UnacknowledgedTcpBytes, CountsWhatAPeerThatDoesNotReadLeavesQueued) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int sender = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(sender, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const int reader = accept(listener, nullptr, nullptr);
  ASSERT_GE(reader, 0);
  const int64_t before = UnacknowledgedTcpBytes();
  EXPECT_EQ(before, 0);
  // More than the reader's receive buffer: the rest stays in the sender's queue.
  const int small = 16 * 1024;
  setsockopt(reader, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  fcntl(sender, F_SETFL, O_NONBLOCK);
  std::vector<char> chunk(64 * 1024, 'x');
  int64_t sent = 0;
  for (int i = 0; i < 256; ++i) {
    const ssize_t n = send(sender, chunk.data(), chunk.size(), 0);
    if (n <= 0) break;
    sent += n;
  }
  ASSERT_GT(sent, 0);
  const int64_t queued = UnacknowledgedTcpBytes();
  EXPECT_GT(queued, 0);
  EXPECT_LE(queued, sent);
  // Once the reader has everything, nothing is left.
  int64_t got = 0;
  const absl::Time give_up = absl::Now() + absl::Minutes(2);
  while (got < sent && absl::Now() < give_up) {
    const ssize_t n = recv(reader, chunk.data(), chunk.size(), 0);
    if (n <= 0) break;
    got += n;
  }
  ASSERT_EQ(got, sent);
  int64_t after = UnacknowledgedTcpBytes();
  while (after != 0 && absl::Now() < give_up) {  // (the last ACK is on its way)
    absl::SleepFor(absl::Milliseconds(10));
    after = UnacknowledgedTcpBytes();
  }
  EXPECT_EQ(after, 0);
  close(reader);
  close(sender);
  close(listener);
}

}  // namespace
}  // namespace adaps
