// Replay of recorded collective schedules on a SimGrid platform (S4U API, SimGrid 3.32).
//
// Built and run by nnabla_torus/simgrid.py, which records the trace and writes the platform:
//   simgrid_replay PLATFORM.xml TRACE.bin [--cfg=name:value ...]
// One actor per rank, on host "r<rank>". Each actor runs its rank's ops in order:
//   SEND / RECV (capped: with a rate limit in B/s) post an asynchronous put / get of the given
//   simulated bytes on the mailbox of (source, destination, key), so messages match first in,
//   first out per (communicator, tag) pair as MPI matches them;
//   WAIT completes the listed requests (ids: the rank's posts, numbered from 0), then sleeps the
//   rank's compute seconds after that wait.
// Prints "end <simulated seconds> <completed waits>" on stdout.
//
// Trace (little-endian): int64 magic, int64 ranks, int64 ints[ranks], int64 floats[ranks], then
// every rank's int32 ops, then every rank's float64 values (bytes, rates, seconds).
#include <simgrid/s4u.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace sg4 = simgrid::s4u;

enum Op : int32_t { SEND = 1, RECV = 2, WAIT = 3, SEND_CAPPED = 4, RECV_CAPPED = 5 };
constexpr int64_t MAGIC = 0x3130304753544e4eLL;  // "NNTSG001"

struct Trace {
  std::vector<int32_t> ints;
  std::vector<double> floats;
  std::vector<int64_t> int_start, float_start;  // per rank, plus the end
};

static Trace trace;
static long long waits_done = 0;

static void die(const std::string& msg)
{
  std::fprintf(stderr, "simgrid_replay: %s\n", msg.c_str());
  std::exit(2);
}

static void read_trace(const char* path)
{
  std::ifstream in(path, std::ios::binary);
  if (!in)
    die(std::string("cannot open trace ") + path);
  int64_t head[2];
  in.read(reinterpret_cast<char*>(head), sizeof head);
  if (!in || head[0] != MAGIC || head[1] < 1)
    die(std::string("not a replay trace: ") + path);
  const int64_t ranks = head[1];
  std::vector<int64_t> counts(2 * ranks);
  in.read(reinterpret_cast<char*>(counts.data()), counts.size() * sizeof(int64_t));
  trace.int_start.assign(1, 0);
  trace.float_start.assign(1, 0);
  for (int64_t r = 0; r < ranks; r++) {
    trace.int_start.push_back(trace.int_start.back() + counts[r]);
    trace.float_start.push_back(trace.float_start.back() + counts[ranks + r]);
  }
  trace.ints.resize(trace.int_start.back());
  trace.floats.resize(trace.float_start.back());
  in.read(reinterpret_cast<char*>(trace.ints.data()), trace.ints.size() * sizeof(int32_t));
  in.read(reinterpret_cast<char*>(trace.floats.data()), trace.floats.size() * sizeof(double));
  if (!in)
    die(std::string("trace truncated: ") + path);
}

static sg4::Mailbox* mailbox(std::unordered_map<int64_t, sg4::Mailbox*>& cache, int src, int dst, int key)
{
  const int64_t id = (static_cast<int64_t>(key) << 40) | (static_cast<int64_t>(src) << 20) | dst;
  auto found = cache.find(id);
  if (found != cache.end())
    return found->second;
  auto* box = sg4::Mailbox::by_name("m" + std::to_string(src) + "_" + std::to_string(dst) + "_" +
                                    std::to_string(key));
  cache.emplace(id, box);
  return box;
}

static void replay(int rank)
{
  const int32_t* op  = trace.ints.data() + trace.int_start[rank];
  const int32_t* end = trace.ints.data() + trace.int_start[rank + 1];
  const double* value = trace.floats.data() + trace.float_start[rank];
  std::vector<sg4::CommPtr> requests;
  std::unordered_map<int64_t, sg4::Mailbox*> boxes;
  static char token;  // no data travels, only simulated sizes; SimGrid wants a non-null payload
  void* payload  = &token;
  void* received       = nullptr;
  while (op < end) {
    const int32_t kind = *op++;
    if (kind == WAIT) {
      const int32_t count = *op++;
      for (int32_t i = 0; i < count; i++) {
        sg4::CommPtr& request = requests.at(*op++);
        request->wait();
        request = nullptr;  // frees the finished communication
      }
      waits_done++;
      const double seconds = *value++;
      if (seconds > 0)
        sg4::this_actor::sleep_for(seconds);
      continue;
    }
    const int peer  = *op++;
    const int key   = *op++;
    const double nbytes = *value++;
    const double rate   = (kind == SEND_CAPPED || kind == RECV_CAPPED) ? *value++ : -1.0;
    sg4::CommPtr comm;
    if (kind == SEND || kind == SEND_CAPPED)
      comm = mailbox(boxes, rank, peer, key)->put_init(payload, static_cast<uint64_t>(std::llround(nbytes)));
    else if (kind == RECV || kind == RECV_CAPPED)
      comm = mailbox(boxes, peer, rank, key)->get_init()->set_dst_data(&received, sizeof(void*));
    else
      die("rank " + std::to_string(rank) + ": unknown op " + std::to_string(kind));
    if (rate > 0)
      comm->set_rate(rate);
    comm->start();
    requests.push_back(comm);
  }
}

int main(int argc, char** argv)
{
  sg4::Engine engine(&argc, argv);  // consumes the --cfg=... arguments
  if (argc != 3)
    die("usage: simgrid_replay PLATFORM.xml TRACE.bin [--cfg=name:value ...]");
  read_trace(argv[2]);
  engine.load_platform(argv[1]);
  const int ranks = static_cast<int>(trace.int_start.size()) - 1;
  for (int r = 0; r < ranks; r++) {
    sg4::Host* host = sg4::Host::by_name_or_null("r" + std::to_string(r));
    if (host == nullptr)
      die("the platform has no host r" + std::to_string(r));
    sg4::Actor::create("rank" + std::to_string(r), host, replay, r);
  }
  engine.run();
  std::printf("end %.17g %lld\n", sg4::Engine::get_clock(), waits_done);
  return 0;
}
