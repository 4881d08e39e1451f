// adaps-keygen: writes a ZeroMQ CURVE key pair for adaps (docs/reliability.md, "Access").
//
//   adaps-keygen NAME   ->  NAME.key (public and secret, mode 0600) and NAME.pub (public)
//
// The cluster's server pair goes to the scheduler and the servers (--curve_server_key),
// its .pub to the workers (--curve_server_key accepts a file with only the public key);
// every node that connects (servers and workers) gets its own pair (--curve_client_key),
// and the .pub files of those allowed are concatenated into --curve_allowed_clients.
#include <sys/stat.h>
#include <zmq.h>

#include <cstdio>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: %s NAME  (writes NAME.key and NAME.pub)\n", argv[0]);
    return argc == 2 ? 0 : 2;
  }
  if (!zmq_has("curve")) {
    std::fprintf(stderr, "adaps-keygen: this libzmq is built without CURVE\n");
    return 1;
  }
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    std::fprintf(stderr, "adaps-keygen: zmq_curve_keypair failed\n");
    return 1;
  }
  const std::string name = argv[1];
  {
    std::ofstream key(name + ".key", std::ios::trunc);
    key << "# adaps CURVE key pair: keep secret\npublic = " << pub << "\nsecret = " << sec << "\n";
    if (!key) {
      std::fprintf(stderr, "adaps-keygen: cannot write %s.key\n", name.c_str());
      return 1;
    }
  }
  chmod((name + ".key").c_str(), 0600);
  std::ofstream p(name + ".pub", std::ios::trunc);
  p << "public = " << pub << "\n";
  if (!p) {
    std::fprintf(stderr, "adaps-keygen: cannot write %s.pub\n", name.c_str());
    return 1;
  }
  std::printf("%s\n", pub);
  return 0;
}
