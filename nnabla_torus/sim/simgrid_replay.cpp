// Replay of recorded collective schedules on a SimGrid platform (S4U API, SimGrid 3.32).
//
// Built and run by nnabla_torus/sim/simgrid.py, which records the trace and writes the platform:
//   simgrid_replay PLATFORM.xml TRACE.bin [--cfg=name:value ...]
// The trace holds streams of ops; stream r < ranks is rank r's own, run by an actor on host
// "r<r>". Ops:
//   SEND / RECV (capped: with a rate limit in B/s): post an asynchronous put / get of the given
//     simulated bytes on the mailbox of (source, destination, communicator key), so messages
//     match first in, first out (the recorder checked that this pairs them as MPI's tags do);
//     requests are numbered per stream;
//   WAIT: complete the listed requests, then compute (sleep) the given seconds;
//   LANES: run the listed streams (a pipelined collective's lanes) as actors on this host and
//     wait for all of them; they compute one at a time (the rank has one thread);
//   DEP: wait until another stream has done a given number of ops (one lane waiting for
//     another's piece).
// Prints "end <simulated seconds> <waits done>" on stdout.
//
// Trace (little-endian): int64 magic, int64 ranks, int64 streams, int64 ints[streams],
// int64 floats[streams], then every stream's int32 ops, then every stream's float64 values
// (bytes, rates, seconds).
#include <simgrid/s4u.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace sg4 = simgrid::s4u;

enum Op : int32_t { SEND = 1, RECV = 2, WAIT = 3, SEND_CAPPED = 4, RECV_CAPPED = 5, LANES = 6, DEP = 7 };
constexpr int64_t MAGIC = 0x3230304753544e4eLL;  // "NNTSG002"

struct Stream {
  const int32_t* op = nullptr;
  const int32_t* end = nullptr;
  const double* value = nullptr;
  int rank = 0;
  long long done = 0;                  // ops done so far (DEP counts these)
  sg4::MutexPtr mutex;                 // with cv: created once another stream depends on this one
  sg4::ConditionVariablePtr cv;
};

struct Rank {
  std::unordered_map<int64_t, sg4::Mailbox*> boxes;
  sg4::MutexPtr compute;  // lanes of one rank compute one at a time
};

static std::vector<int32_t> ints;
static std::vector<double> floats;
static std::vector<Stream> streams;
static std::vector<Rank> ranks;
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
  int64_t head[3];
  in.read(reinterpret_cast<char*>(head), sizeof head);
  if (!in || head[0] != MAGIC || head[1] < 1 || head[2] < head[1])
    die(std::string("not a replay trace of this version: ") + path);
  const int64_t count = head[2];
  std::vector<int64_t> sizes(2 * count);
  in.read(reinterpret_cast<char*>(sizes.data()), sizes.size() * sizeof(int64_t));
  int64_t total_ints = 0, total_floats = 0;
  for (int64_t s = 0; s < count; s++) {
    total_ints += sizes[s];
    total_floats += sizes[count + s];
  }
  ints.resize(total_ints);
  floats.resize(total_floats);
  in.read(reinterpret_cast<char*>(ints.data()), ints.size() * sizeof(int32_t));
  in.read(reinterpret_cast<char*>(floats.data()), floats.size() * sizeof(double));
  if (!in)
    die(std::string("trace truncated: ") + path);
  streams.resize(count);
  ranks.resize(head[1]);
  int64_t at_int = 0, at_float = 0;
  for (int64_t s = 0; s < count; s++) {
    streams[s].op    = ints.data() + at_int;
    streams[s].end   = ints.data() + at_int + sizes[s];
    streams[s].value = floats.data() + at_float;
    streams[s].rank  = s < head[1] ? static_cast<int>(s) : -1;  // lanes: set by LANES
    at_int += sizes[s];
    at_float += sizes[count + s];
  }
}

static sg4::Mailbox* mailbox(Rank& rank, int src, int dst, int key)
{
  const int64_t id = (static_cast<int64_t>(key) << 40) | (static_cast<int64_t>(src) << 20) | dst;
  auto found = rank.boxes.find(id);
  if (found != rank.boxes.end())
    return found->second;
  auto* box = sg4::Mailbox::by_name("m" + std::to_string(src) + "_" + std::to_string(dst) + "_" +
                                    std::to_string(key));
  rank.boxes.emplace(id, box);
  return box;
}

static void run(int index)
{
  Stream& me = streams[index];
  Rank& rank = ranks[me.rank];
  const bool lane = index >= static_cast<int>(ranks.size());
  std::vector<sg4::CommPtr> requests;
  static char token;  // no data travels, only simulated sizes; SimGrid wants a non-null payload
  void* payload  = &token;
  void* received = nullptr;
  while (me.op < me.end) {
    const int32_t kind = *me.op++;
    if (kind == WAIT) {
      const int32_t count = *me.op++;
      for (int32_t i = 0; i < count; i++) {
        sg4::CommPtr& request = requests.at(*me.op++);
        request->wait();
        request = nullptr;  // frees the finished communication
      }
      waits_done++;
      const double seconds = *me.value++;
      if (seconds > 0 && lane) {
        std::unique_lock<sg4::Mutex> hold(*rank.compute);
        sg4::this_actor::sleep_for(seconds);
      } else if (seconds > 0) {
        sg4::this_actor::sleep_for(seconds);
      }
    } else if (kind == LANES) {
      const int32_t count = *me.op++;
      if (!rank.compute)
        rank.compute = sg4::Mutex::create();
      std::vector<sg4::ActorPtr> actors;
      for (int32_t i = 0; i < count; i++) {
        const int32_t sub = *me.op++;
        streams[sub].rank = me.rank;
        actors.push_back(sg4::Actor::create("lane" + std::to_string(sub), sg4::this_actor::get_host(), run, sub));
      }
      for (const auto& actor : actors)
        actor->join();
    } else if (kind == DEP) {
      Stream& other        = streams.at(*me.op++);
      const long long need = *me.op++;
      if (other.done < need) {
        if (!other.cv) {
          other.mutex = sg4::Mutex::create();
          other.cv    = sg4::ConditionVariable::create();
        }
        std::unique_lock<sg4::Mutex> lock(*other.mutex);
        while (other.done < need)
          other.cv->wait(lock);
      }
    } else if (kind >= SEND && kind <= RECV_CAPPED) {
      const int peer      = *me.op++;
      const int key       = *me.op++;
      const double nbytes = *me.value++;
      const bool send     = kind == SEND || kind == SEND_CAPPED;
      const double rate   = (kind == SEND_CAPPED || kind == RECV_CAPPED) ? *me.value++ : -1.0;
      sg4::CommPtr comm =
          send ? mailbox(rank, me.rank, peer, key)->put_init(payload, static_cast<uint64_t>(std::llround(nbytes)))
               : mailbox(rank, peer, me.rank, key)->get_init()->set_dst_data(&received, sizeof(void*));
      if (rate > 0)
        comm->set_rate(rate);
      comm->start();
      requests.push_back(comm);
    } else {
      die("stream " + std::to_string(index) + ": unknown op " + std::to_string(kind));
    }
    me.done++;
    if (me.cv)
      me.cv->notify_all();
  }
}

int main(int argc, char** argv)
{
  sg4::Engine engine(&argc, argv);  // consumes the --cfg=... arguments
  if (argc != 3)
    die("usage: simgrid_replay PLATFORM.xml TRACE.bin [--cfg=name:value ...]");
  read_trace(argv[2]);
  engine.load_platform(argv[1]);
  for (size_t r = 0; r < ranks.size(); r++) {
    sg4::Host* host = sg4::Host::by_name_or_null("r" + std::to_string(r));
    if (host == nullptr)
      die("the platform has no host r" + std::to_string(r));
    sg4::Actor::create("rank" + std::to_string(r), host, run, static_cast<int>(r));
  }
  engine.run();
  std::printf("end %.17g %lld\n", sg4::Engine::get_clock(), waits_done);
  return 0;
}
