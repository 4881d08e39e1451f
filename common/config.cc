#include "common/config.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace adaps {

absl::StatusOr<std::map<std::string, std::string>> ReadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file '", path, "'"));
  std::map<std::string, std::string> values;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    absl::string_view view = line;
    size_t hash = view.find('#');
    if (hash != absl::string_view::npos) view = view.substr(0, hash);
    view = absl::StripAsciiWhitespace(view);
    if (view.empty()) continue;
    size_t eq = view.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", lineno, ": expected 'name = value'"));
    }
    absl::string_view name = absl::StripAsciiWhitespace(view.substr(0, eq));
    absl::ConsumePrefix(&name, "--");
    absl::string_view value = absl::StripAsciiWhitespace(view.substr(eq + 1));
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno, ": empty name"));
    }
    values[std::string(name)] = std::string(value);
  }
  return values;
}

namespace {

absl::Status SetFlag(const std::string& name, const std::string& value,
                     const std::string& source) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": unknown setting '", name, "'"));
  }
  std::string error;
  if (!flag->ParseFrom(value, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": bad value '", value, "' for ", name, ": ", error));
  }
  return absl::OkStatus();
}

std::string FindConfigPath(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (absl::ConsumePrefix(&arg, "--config=") || absl::ConsumePrefix(&arg, "-config=")) {
      return std::string(arg);
    }
    if ((arg == "--config" || arg == "-config") && i + 1 < argc) return argv[i + 1];
  }
  const char* env = std::getenv("ADAPS_CONFIG");
  return env ? env : "";
}

}  // namespace

absl::Status LoadLayeredFlags(int argc, char** argv, absl::Span<const std::string> flag_names,
                              std::vector<std::string>* sources) {
  const std::string path = FindConfigPath(argc, argv);
  if (!path.empty()) {
    auto values = ReadConfigFile(path);
    if (!values.ok()) return values.status();
    for (const auto& [name, value] : *values) {
      if (name == "config") continue;
      bool known = false;
      for (const auto& n : flag_names) known = known || n == name;
      if (!known) {
        return absl::InvalidArgumentError(
            absl::StrCat("config file ", path, ": unknown setting '", name, "'"));
      }
      if (auto s = SetFlag(name, value, absl::StrCat("config file ", path)); !s.ok()) return s;
      if (sources) sources->push_back(absl::StrCat(name, "=", value, " (", path, ")"));
    }
  }
  for (const auto& name : flag_names) {
    const std::string var = absl::StrCat("ADAPS_", absl::AsciiStrToUpper(name));
    const char* value = std::getenv(var.c_str());
    if (value == nullptr) continue;
    if (auto s = SetFlag(name, value, absl::StrCat("environment ", var)); !s.ok()) return s;
    if (sources) sources->push_back(absl::StrCat(name, "=", value, " (", var, ")"));
  }
  return absl::OkStatus();
}

void InstallUsage(const std::string& usage) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "main.cc");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  // "scheduler/main.cc", not the build's "../scheduler/main.cc" or an absolute path.
  config.normalize_filename = [](absl::string_view file) {
    const size_t last = file.rfind('/');
    const size_t dir = last == absl::string_view::npos || last == 0
                           ? absl::string_view::npos
                           : file.rfind('/', last - 1);
    return std::string(dir == absl::string_view::npos ? file : file.substr(dir + 1));
  };
  absl::SetFlagsUsageConfig(config);
}

std::string DescribeFlags(absl::Span<const std::string> flag_names) {
  std::vector<std::string> parts;
  for (const auto& name : flag_names) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (!flag) continue;
    // Secrets never reach a log: a set token shows as <set>.
    const bool secret = absl::EndsWith(name, "_token");
    const std::string value = flag->CurrentValue();
    parts.push_back(absl::StrCat(name, "=", secret && !value.empty() ? "<set>" : value));
  }
  return absl::StrJoin(parts, " ");
}

namespace {

bool IsZ85Key(absl::string_view k) {
  static constexpr absl::string_view kZ85 =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (k.size() != 40) return false;
  for (char c : k) {
    if (kZ85.find(c) == absl::string_view::npos) return false;
  }
  return true;
}

// Z85 keys may contain '#' and '=': only whole lines starting with '#' are comments, and a
// line is split at its first '='.
absl::Status ReadKeyFile(const std::string& path, std::string* pub, std::string* sec) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read key file '", path, "'"));
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    absl::string_view v = absl::StripAsciiWhitespace(line);
    if (v.empty() || v[0] == '#') continue;
    const size_t eq = v.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("key file '", path, "' line ", lineno, ": expected name = key"));
    }
    const std::string name(absl::StripAsciiWhitespace(v.substr(0, eq)));
    const absl::string_view value = absl::StripAsciiWhitespace(v.substr(eq + 1));
    if (name != "public" && name != "secret") {
      return absl::InvalidArgumentError(
          absl::StrCat("key file '", path, "': unknown entry '", name, "'"));
    }
    if (!IsZ85Key(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("key file '", path, "': ", name, " key is not 40 Z85 characters"));
    }
    (name == "public" ? *pub : *sec) = std::string(value);
  }
  if (pub->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("key file '", path, "' has no public key"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CurveKeys> LoadCurveKeys(const std::string& server_key_file,
                                        const std::string& client_key_file,
                                        const std::string& allowed_clients_file, bool serving) {
  CurveKeys keys;
  if (server_key_file.empty()) {
    if (!client_key_file.empty() || !allowed_clients_file.empty()) {
      return absl::InvalidArgumentError(
          "CURVE client keys or an allowed-clients list given without --curve_server_key");
    }
    return keys;  // plaintext
  }
  absl::Status s = ReadKeyFile(server_key_file, &keys.server_public_key, &keys.server_secret_key);
  if (!s.ok()) return s;
  if (serving && keys.server_secret_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--curve_server_key '", server_key_file, "' has no secret key (needed to serve)"));
  }
  if (!client_key_file.empty()) {
    s = ReadKeyFile(client_key_file, &keys.client_public_key, &keys.client_secret_key);
    if (!s.ok()) return s;
    if (keys.client_secret_key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--curve_client_key '", client_key_file, "' has no secret key"));
    }
  }
  if (serving) {
    if (allowed_clients_file.empty()) {
      return absl::InvalidArgumentError(
          "CURVE needs --curve_allowed_clients on the scheduler and the servers");
    }
    std::ifstream in(allowed_clients_file);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("cannot read allowed clients file '", allowed_clients_file, "'"));
    }
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      absl::string_view v = absl::StripAsciiWhitespace(line);
      if (!v.empty() && v[0] == '#') continue;
      if (absl::ConsumePrefix(&v, "public")) {
        v = absl::StripAsciiWhitespace(v);
        absl::ConsumePrefix(&v, "=");
        v = absl::StripAsciiWhitespace(v);
      }
      if (v.empty()) continue;
      if (!IsZ85Key(v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "allowed clients file '", allowed_clients_file, "' line ", lineno,
            ": not a 40-character Z85 public key"));
      }
      keys.allowed_clients.emplace_back(v);
    }
  }
  return keys;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!(out << text)) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::Status WritePortFile(const std::string& path, const std::string& endpoint) {
  return WriteFileAtomically(path, endpoint.substr(endpoint.rfind(':') + 1) + "\n");
}

absl::Status CheckPort(absl::string_view flag, int64_t port) {
  if (port >= 0 && port <= 65535) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", port, ": not a TCP port (0 to 65535; 0: the OS chooses)"));
}

absl::Status CheckFraction(absl::string_view flag, double value) {
  if (value > 0.0 && value <= 1.0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": must be a fraction in (0, 1]"));
}

absl::StatusOr<std::string> ResolveListenHost(absl::string_view flag, const std::string& host) {
  if (host == "*") return host;
  unsigned char addr[sizeof(struct in6_addr)];
  if (inet_pton(AF_INET, host.c_str(), addr) == 1 || inet_pton(AF_INET6, host.c_str(), addr) == 1) {
    return host;
  }
  if (!host.empty() && host.size() < IF_NAMESIZE && if_nametoindex(host.c_str()) != 0) {
    return host;  // an interface name, e.g. eth0
  }
  if (!host.empty()) {
    struct addrinfo hints = {};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &found) == 0 && found != nullptr) {
      char text[INET_ADDRSTRLEN] = {};
      const auto* in = reinterpret_cast<const struct sockaddr_in*>(found->ai_addr);
      const bool ok = inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr;
      freeaddrinfo(found);
      if (ok) return std::string(text);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, "='", host,
      "': not an IP address, '*', a network interface or a resolvable host name"));
}

absl::Status CheckConnectEndpoint(absl::string_view flag, const std::string& endpoint) {
  absl::string_view rest = endpoint;
  if (absl::StartsWith(rest, "ipc://") || absl::StartsWith(rest, "inproc://")) {
    return absl::OkStatus();
  }
  const size_t colon = rest.rfind(':');
  int port = 0;
  if (!absl::ConsumePrefix(&rest, "tcp://") || colon == absl::string_view::npos ||
      colon <= 6 || !absl::SimpleAtoi(absl::string_view(endpoint).substr(colon + 1), &port) ||
      port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "='", endpoint, "': expected tcp://HOST:PORT (port 1 to 65535)"));
  }
  return absl::OkStatus();
}

absl::Status CheckReadableDir(absl::string_view flag, const std::string& path) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "='", path, "': no such directory"));
  }
  if (access(path.c_str(), R_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "='", path, "': directory is not readable"));
  }
  return absl::OkStatus();
}

absl::Status FirstError(std::initializer_list<absl::Status> checks) {
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace adaps
