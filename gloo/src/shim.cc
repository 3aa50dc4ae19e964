// The C interface the Rust side of neuron-pc-gloo calls: one process's member of a group of
// processes (a gloo context over TCP, connected through the caller's key-value store) and the
// collectives neuron-pc needs on it. Every function catches what gloo throws and returns it as
// a message (malloc'ed; the caller frees it with npc_gloo_free_message); NULL is success.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

namespace {

char* message(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, text.data(), text.size());
    out[text.size()] = '\0';
  }
  return out;
}

}  // namespace

extern "C" {

// Where the store's callbacks put a value or an error text (a std::string the shim owns).
void npc_gloo_string_assign(void* string, const char* data, size_t len) {
  static_cast<std::string*>(string)->assign(data, len);
}

// The caller's key-value store. Each callback returns 0 on success; otherwise it has written
// the reason into `error` with npc_gloo_string_assign. `get` blocks until the key exists or
// `timeout_ms` passes.
struct npc_gloo_store {
  void* ctx;
  int (*set)(void* ctx, const char* key, size_t key_len, const char* value, size_t value_len,
             void* error);
  int (*get)(void* ctx, const char* key, size_t key_len, int64_t timeout_ms, void* value,
             void* error);
};

void npc_gloo_free_message(char* text) { std::free(text); }

}  // extern "C"

namespace {

class CallbackStore : public gloo::rendezvous::Store {
 public:
  CallbackStore(const npc_gloo_store* store, int64_t timeout_ms)
      : store_(store), timeout_ms_(timeout_ms) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    std::string error;
    if (store_->set(store_->ctx, key.data(), key.size(), data.data(), data.size(), &error) != 0) {
      throw std::runtime_error("store: " + error);
    }
  }

  std::vector<char> get(const std::string& key) override { return get(key, timeout_ms_); }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(timeout_ms_));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const auto& key : keys) get(key, timeout.count());
  }

 private:
  std::vector<char> get(const std::string& key, int64_t timeout_ms) {
    std::string value;
    std::string error;
    if (store_->get(store_->ctx, key.data(), key.size(), timeout_ms, &value, &error) != 0) {
      throw std::runtime_error("store: " + error);
    }
    return std::vector<char>(value.begin(), value.end());
  }

  const npc_gloo_store* store_;
  int64_t timeout_ms_;
};

// The most bytes of received blocks a group keeps between reduce-scatters: a fresh buffer of
// a bucket's size for every call costs its page faults each time.
constexpr size_t kKeptScratch = size_t(64) << 20;

struct Group {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  // where a reduce-scatter receives the blocks (one call at a time uses a group)
  std::mutex scratch_lock;
  std::vector<char> scratch;
};

// bfloat16 as its bits: widened to f32 to combine, rounded to nearest even back.
float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

struct Bf16 {
  using Storage = uint16_t;
  static float load(uint16_t v) { return bf16_to_f32(v); }
  static uint16_t store(float v) { return f32_to_bf16(v); }
};

struct F16 {
  using Storage = gloo::float16;
  static float load(gloo::float16 v) { return gloo::cpu_half2float(v); }
  static gloo::float16 store(float v) { return gloo::cpu_float2half_rn(v); }
};

enum Op { kSum = 0, kProd = 1, kMax = 2, kMin = 3 };

float combine(int op, float a, float b) {
  switch (op) {
    case kSum: return a + b;
    case kProd: return a * b;
    case kMax: return (std::isnan(a) || a > b) ? a : b;
    default: return (std::isnan(a) || a < b) ? a : b;
  }
}

// A 16-bit float type's combiner: each element widened to f32, combined, rounded back.
template <typename H, int OP>
void half_combine(void* c, const void* a, const void* b, size_t n) {
  using S = typename H::Storage;
  auto* out = static_cast<S*>(c);
  auto* x = static_cast<const S*>(a);
  auto* y = static_cast<const S*>(b);
  for (size_t i = 0; i < n; i++) out[i] = H::store(combine(OP, H::load(x[i]), H::load(y[i])));
}

template <typename H>
gloo::AllreduceOptions::Func half_func(int op) {
  switch (op) {
    case kSum: return half_combine<H, kSum>;
    case kProd: return half_combine<H, kProd>;
    case kMax: return half_combine<H, kMax>;
    default: return half_combine<H, kMin>;
  }
}

template <typename T>
gloo::AllreduceOptions::Func plain_func(int op) {
  using F = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case kSum: return static_cast<F>(&gloo::sum<T>);
    case kProd: return static_cast<F>(&gloo::product<T>);
    case kMax: return static_cast<F>(&gloo::max<T>);
    default: return static_cast<F>(&gloo::min<T>);
  }
}

// The element types, numbered as the Rust side's `Element`.
enum Dtype {
  kF32 = 0, kF64 = 1, kBf16 = 2, kF16 = 3, kS8 = 4, kS16 = 5, kS32 = 6, kS64 = 7,
  kU8 = 8, kU16 = 9, kU32 = 10, kU64 = 11,
};

// The combiner of `op` for element type `dtype` and the element's size in bytes; a null
// combiner for an unknown type.
gloo::AllreduceOptions::Func combiner(int dtype, int op, size_t* size) {
  switch (dtype) {
    case kF32: *size = 4; return plain_func<float>(op);
    case kF64: *size = 8; return plain_func<double>(op);
    case kBf16: *size = 2; return half_func<Bf16>(op);
    case kF16: *size = 2; return half_func<F16>(op);
    case kS8: *size = 1; return plain_func<int8_t>(op);
    case kS16: *size = 2; return plain_func<int16_t>(op);
    case kS32: *size = 4; return plain_func<int32_t>(op);
    case kS64: *size = 8; return plain_func<int64_t>(op);
    case kU8: *size = 1; return plain_func<uint8_t>(op);
    case kU16: *size = 2; return plain_func<uint16_t>(op);
    case kU32: *size = 4; return plain_func<uint32_t>(op);
    case kU64: *size = 8; return plain_func<uint64_t>(op);
    default: *size = 0; return nullptr;
  }
}

template <typename T>
void set_reduce(gloo::AllreduceOptions& opts, void* data, size_t count,
                gloo::AllreduceOptions::Func f) {
  opts.setOutput(static_cast<T*>(data), count);
  opts.setReduceFunction(f);
}

// Fills in the buffer and the combiner; false for an unknown element type. gloo reads the
// buffer as elements of the pointer type's size and combines them only through the combiner,
// so an unsigned type of the element's size stands for every type of that size.
bool configure(gloo::AllreduceOptions& opts, void* data, size_t count, int dtype, int op) {
  size_t size = 0;
  auto f = combiner(dtype, op, &size);
  switch (size) {
    case 1: set_reduce<uint8_t>(opts, data, count, f); return true;
    case 2: set_reduce<uint16_t>(opts, data, count, f); return true;
    case 4: set_reduce<uint32_t>(opts, data, count, f); return true;
    case 8: set_reduce<uint64_t>(opts, data, count, f); return true;
    default: return false;
  }
}

template <typename F>
char* guarded(F&& body) {
  try {
    body();
    return nullptr;
  } catch (const std::exception& e) {
    return message(e.what());
  } catch (...) {
    return message("unknown C++ exception");
  }
}

}  // namespace

extern "C" {

// Connects member `rank` of `size` through `store` (every member calls this with the same
// store keys). `iface` (a network interface) or else `hostname` names the address this member
// listens on. On success `*group` is the group; free it with npc_gloo_close.
char* npc_gloo_connect(const npc_gloo_store* store, int rank, int size, const char* iface,
                       const char* hostname, int64_t timeout_ms, void** group) {
  return guarded([&] {
    gloo::transport::tcp::attr attr;
    if (iface != nullptr && iface[0] != '\0') attr.iface = iface;
    if (hostname != nullptr && hostname[0] != '\0') attr.hostname = hostname;
    auto g = std::make_unique<Group>();
    g->device = gloo::transport::tcp::CreateDevice(attr);
    g->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    g->context->setTimeout(std::chrono::milliseconds(timeout_ms));
    CallbackStore s(store, timeout_ms);
    g->context->connectFullMesh(s, g->device);
    *group = g.release();
  });
}

void npc_gloo_close(void* group) { delete static_cast<Group*>(group); }

// Reduces `count` elements at `data` over the group, in place.
char* npc_gloo_allreduce(void* group, void* data, size_t count, int dtype, int op, uint32_t tag,
                         int64_t timeout_ms) {
  return guarded([&] {
    auto* g = static_cast<Group*>(group);
    gloo::AllreduceOptions opts(g->context);
    if (!configure(opts, data, count, dtype, op)) {
      throw std::runtime_error("unsupported element type " + std::to_string(dtype));
    }
    opts.setTag(tag);
    opts.setTimeout(std::chrono::milliseconds(timeout_ms));
    gloo::allreduce(opts);
  });
}

// Gathers every member's `bytes` at `input` into `output` (size x bytes, in rank order).
char* npc_gloo_allgather(void* group, const void* input, void* output, size_t bytes,
                         uint32_t tag, int64_t timeout_ms) {
  return guarded([&] {
    auto* g = static_cast<Group*>(group);
    gloo::AllgatherOptions opts(g->context);
    opts.setInput(const_cast<char*>(static_cast<const char*>(input)), bytes);
    opts.setOutput(static_cast<char*>(output), bytes * g->context->size);
    opts.setTag(tag);
    opts.setTimeout(std::chrono::milliseconds(timeout_ms));
    gloo::allgather(opts);
  });
}

// Reduces `count` elements at `input` over the group; this member keeps block `rank` of the
// result (count / size elements) in `output`. Block k of every member's input goes to member
// k in one all-to-all (each member sends and receives (size - 1) / size of the input, as a
// ring's reduce-scatter does), and each member combines the blocks it received.
char* npc_gloo_reduce_scatter(void* group, const void* input, void* output, size_t count,
                              int dtype, int op, uint32_t tag, int64_t timeout_ms) {
  return guarded([&] {
    auto* g = static_cast<Group*>(group);
    size_t size = 0;
    auto combine_into = combiner(dtype, op, &size);
    if (combine_into == nullptr) {
      throw std::runtime_error("unsupported element type " + std::to_string(dtype));
    }
    const size_t members = static_cast<size_t>(g->context->size);
    const size_t block = count / members;
    std::lock_guard<std::mutex> held(g->scratch_lock);
    std::vector<char> fresh;
    std::vector<char>& received = count * size <= kKeptScratch ? g->scratch : fresh;
    if (received.size() < count * size) received.resize(count * size);
    gloo::AlltoallOptions opts(g->context);
    opts.setInput(const_cast<char*>(static_cast<const char*>(input)), count * size);
    opts.setOutput(received.data(), count * size);
    opts.setTag(tag);
    opts.setTimeout(std::chrono::milliseconds(timeout_ms));
    gloo::alltoall(opts);
    char* out = static_cast<char*>(output);
    std::memcpy(out, received.data(), block * size);
    for (size_t k = 1; k < members; k++) {
      combine_into(out, out, received.data() + k * block * size, block);
    }
  });
}

}  // extern "C"
