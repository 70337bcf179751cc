// FlashAttention-2's eager autograd node in C++: the launches of the Triton kernels, forward and backward,
// without Python on the host path (native.py says why and builds what this file runs).
//
// A *program* is what Python derived once per input geometry: for each kernel launch the loaded
// CUfunction, grid, threads, dynamic shared memory, and the kernel's parameters in Triton's order
// (tensor slots, integer values, Triton's global scratch, null pointers, and the Gluon kernels' TMA
// descriptors: a CUtensorMap encoded at each launch, since only the tensor's address changes). `forward(q, k, v, is_causal)`
// finds the program by the inputs' geometry, allocates O and L, launches, and records a FlashBackward
// node holding Q, K, V, O and L; the engine later calls its apply(dO) on its device thread, which
// allocates D, dQ, dK, dV and launches the backward kernels: no Python, so no GIL on that thread.
//
// CUDA is reached through the driver API by dlsym (libcuda.so.1 is loaded by PyTorch), so the file
// builds against any PyTorch's headers, CUDA or CPU-only.

#include <dlfcn.h>
#include <torch/extension.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <unordered_map>

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// The driver entry points used, declared as cuda.h declares them (ABI-stable since CUDA 4/10).
using CUresult = int;
using LaunchKernel = CUresult (*)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shared, void* stream, void** params, void** extra);
using GetErrorString = CUresult (*)(CUresult, const char**);
using StreamIsCapturing = CUresult (*)(void* stream, int* status);
using CtxGetCurrent = CUresult (*)(void** context);
using CtxSetCurrent = CUresult (*)(void* context);
using DeviceGet = CUresult (*)(int* device, int ordinal);
using PrimaryCtxRetain = CUresult (*)(void** context, int device);
// cuTensorMapEncodeTiled (CUDA 12.0+), its enums as ints: data type, rank, address, dims, byte strides, box,
// element strides, interleave, swizzle, L2 promotion, out-of-bounds fill.
using TensorMapEncodeTiled = CUresult (*)(void* map, int dtype, uint32_t rank, void* address, const uint64_t* dims,
                                          const uint64_t* strides, const uint32_t* box, const uint32_t* element_strides,
                                          int interleave, int swizzle, int l2_promotion, int fill);

struct Driver {
  LaunchKernel launch = nullptr;
  GetErrorString error_string = nullptr;
  StreamIsCapturing is_capturing = nullptr;
  CtxGetCurrent ctx_get_current = nullptr;
  CtxSetCurrent ctx_set_current = nullptr;
  DeviceGet device_get = nullptr;
  PrimaryCtxRetain primary_ctx_retain = nullptr;
  TensorMapEncodeTiled encode_tiled = nullptr;  // null on drivers before CUDA 12: no Gluon programs then
};

const Driver& driver() {
  static const Driver d = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    TORCH_CHECK(lib != nullptr, "flash_autograd: cannot open libcuda.so.1 (no NVIDIA driver?)");
    Driver out;
    out.launch = reinterpret_cast<LaunchKernel>(dlsym(lib, "cuLaunchKernel"));
    out.error_string = reinterpret_cast<GetErrorString>(dlsym(lib, "cuGetErrorString"));
    out.is_capturing = reinterpret_cast<StreamIsCapturing>(dlsym(lib, "cuStreamIsCapturing"));
    out.ctx_get_current = reinterpret_cast<CtxGetCurrent>(dlsym(lib, "cuCtxGetCurrent"));
    out.ctx_set_current = reinterpret_cast<CtxSetCurrent>(dlsym(lib, "cuCtxSetCurrent"));
    out.device_get = reinterpret_cast<DeviceGet>(dlsym(lib, "cuDeviceGet"));
    out.primary_ctx_retain = reinterpret_cast<PrimaryCtxRetain>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
    out.encode_tiled = reinterpret_cast<TensorMapEncodeTiled>(dlsym(lib, "cuTensorMapEncodeTiled"));
    TORCH_CHECK(out.launch && out.error_string && out.is_capturing && out.ctx_get_current && out.ctx_set_current &&
                    out.device_get && out.primary_ctx_retain,
                "flash_autograd: libcuda.so.1 lacks one of the driver functions this file calls");
    return out;
  }();
  return d;
}

void check(CUresult status, const char* what, const std::string& name) {
  if (status != 0) {
    const char* text = nullptr;
    driver().error_string(status, &text);
    TORCH_CHECK(false, "flash_autograd: ", what, " ", name, " failed: ", text ? text : "unknown CUDA error");
  }
}

// The runtime API makes a device's primary context current lazily, per thread, and autograd's device
// thread may not have one yet when a backward starts; the driver API needs it (Triton's launcher does
// the same, `ensureCudaContext`).
void ensure_context(int ordinal) {
  const Driver& cuda = driver();
  void* context = nullptr;
  check(cuda.ctx_get_current(&context), "cuCtxGetCurrent", "");
  if (context != nullptr) return;
  int device = 0;
  check(cuda.device_get(&device, ordinal), "cuDeviceGet", std::to_string(ordinal));
  check(cuda.primary_ctx_retain(&context, device), "cuDevicePrimaryCtxRetain", std::to_string(ordinal));
  check(cuda.ctx_set_current(context), "cuCtxSetCurrent", std::to_string(ordinal));
}

// Tensor slots of a call: the forward's, then the backward's, then the program's own (workspaces).
// DQ_ACC: the fused Gluon backward's fp32 dQ accumulator, allocated per backward where the program asks for one.
enum Slot : int64_t { Q, K, V, OUT, LSE, GRAD_OUT, DELTA, GRAD_Q, GRAD_K, GRAD_V, DQ_ACC, HELD };
enum Kind : int64_t { TENSOR = 0, I32 = 1, I64 = 2, I8 = 3, SCRATCH = 4, NULL_POINTER = 5, TENSOR_MAP = 6 };
constexpr size_t MAX_PARAMS = 64;
constexpr size_t MAX_MAPS = 8;   // TMA descriptors per launch
constexpr size_t MAX_RANK = 5;   // TMA's limit
// cuTensorMapEncodeTiled's constants as Triton's launcher passes them (driver.c, fillTMADescriptor).
constexpr int INTERLEAVE_NONE = 0;
constexpr int L2_PROMOTION_128B = 2;

// A CUtensorMap: 128 opaque bytes, 64-byte aligned for the encode (128 as Triton keeps it).
struct alignas(128) EncodedMap {
  uint64_t opaque[16];
};
static_assert(sizeof(EncodedMap) == 128, "a CUtensorMap is 128 bytes");

// A TMA descriptor of a tensor slot, in the driver's order (innermost dimension first): what Triton's
// fillTMADescriptor derives from a descriptor's shape, strides and its compiled metadata.
struct TensorMap {
  int64_t slot;
  int dtype;    // CUtensorMapDataType
  uint32_t rank;
  std::array<uint64_t, MAX_RANK> dims{};
  std::array<uint64_t, MAX_RANK> strides{};  // bytes, rank - 1 of them (the innermost is the element)
  std::array<uint32_t, MAX_RANK> box{};
  int swizzle;  // CUtensorMapSwizzle
  int fill;     // CUtensorMapFloatOOBfill
};

struct Param {
  int64_t kind;
  int64_t value;  // the slot of a TENSOR, the value of an integer
};

struct Launch {
  std::string name;
  void* function;
  std::array<unsigned, 3> grid;
  unsigned threads;
  unsigned shared;
  int64_t scratch_bytes;  // Triton's global scratch for the whole grid (0: none)
  std::vector<Param> params;
  std::vector<TensorMap> maps;  // a TENSOR_MAP parameter's value indexes these
};

struct Program {
  std::vector<Launch> forward;
  std::vector<Launch> backward;
  std::vector<at::Tensor> held;  // slots HELD, HELD + 1, ...
  std::vector<int64_t> zeroed;    // gradient slots the backward's kernels add into rather than store
  int64_t dq_accumulator = 0;     // fp32 elements of DQ_ACC (0: none)
};

using Tensors = std::array<at::Tensor, HELD>;

// PyTorch holds autograd nodes by std::shared_ptr up to 2.12 and by c10::intrusive_ptr since; the branch not
// taken is never instantiated (its names depend on T), so the file builds against either.
constexpr bool kSharedNodes = std::is_same_v<decltype(torch::autograd::Edge().function), std::shared_ptr<Node>>;

template <class T, class... Args>
auto make_node(Args&&... args) {
  if constexpr (kSharedNodes) {
    // deleteNode (found through T's base, Node), as PyTorch's generated nodes use: frees long chains without deep recursion
    return std::shared_ptr<T>(new T(std::forward<Args>(args)...), [](T* p) { deleteNode(p); });
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

void* stream_of(const at::Tensor& t) {
  auto stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device());
  return stream.native_handle();
}

const at::Tensor& tensor_of(int64_t slot, const Tensors& tensors, const Program& program) {
  return slot < HELD ? tensors[slot] : program.held[slot - HELD];
}

void launch_all(const std::vector<Launch>& launches, const Tensors& tensors, const Program& program, void* stream) {
  const Driver& cuda = driver();
  ensure_context(tensors[Q].device().index());
  for (const Launch& launch : launches) {
    std::array<int64_t, MAX_PARAMS> values{};
    std::array<void*, MAX_PARAMS> pointers{};
    std::array<EncodedMap, MAX_MAPS> maps;
    at::Tensor scratch;
    size_t i = 0;
    for (const Param& param : launch.params) {
      if (param.kind == TENSOR_MAP) {
        // Passed by value: the 128 bytes themselves are the parameter.
        const TensorMap& map = launch.maps[param.value];
        static constexpr std::array<uint32_t, MAX_RANK> element_strides{1, 1, 1, 1, 1};
        check(cuda.encode_tiled(&maps[param.value], map.dtype, map.rank, tensor_of(map.slot, tensors, program).data_ptr(),
                                map.dims.data(), map.strides.data(), map.box.data(), element_strides.data(),
                                INTERLEAVE_NONE, map.swizzle, L2_PROMOTION_128B, map.fill),
              "encoding a tensor map of", launch.name);
        pointers[i++] = &maps[param.value];
        continue;
      }
      switch (param.kind) {
        case TENSOR: {
          values[i] = reinterpret_cast<int64_t>(tensor_of(param.value, tensors, program).data_ptr());
          break;
        }
        case I32: {
          int32_t v = static_cast<int32_t>(param.value);
          std::memcpy(&values[i], &v, sizeof v);
          break;
        }
        case I8: {
          int8_t v = static_cast<int8_t>(param.value);
          std::memcpy(&values[i], &v, sizeof v);
          break;
        }
        case I64:
          values[i] = param.value;
          break;
        case SCRATCH:
          // Stream-ordered like every allocation of PyTorch's caching allocator (and from the graph's pool
          // while a CUDA graph captures), so a later launch never overwrites scratch a queued one still reads.
          scratch = at::empty({launch.scratch_bytes}, tensors[Q].options().dtype(at::kByte));
          values[i] = reinterpret_cast<int64_t>(scratch.data_ptr());
          break;
        case NULL_POINTER:
          values[i] = 0;
          break;
      }
      pointers[i] = &values[i];
      ++i;
    }
    check(cuda.launch(launch.function, launch.grid[0], launch.grid[1], launch.grid[2], launch.threads, 1, 1,
                      launch.shared, stream, pointers.data(), nullptr),
          "launching", launch.name);
  }
}

struct FlashBackward : public Node {
  std::shared_ptr<const Program> program;
  SavedVariable q_, k_, v_, out_, lse_;
  bool is_causal = false;

  std::string name() const override { return "FlashAttentionNativeBackward"; }

  void release_variables() override {
    q_.reset_data();
    k_.reset_data();
    v_.reset_data();
    out_.reset_data();
    lse_.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    at::Tensor grad_out = grads[0];
    if (!grad_out.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    Tensors t;
    t[Q] = q_.unpack();
    t[K] = k_.unpack();
    t[V] = v_.unpack();
    t[OUT] = out_.unpack();
    t[LSE] = lse_.unpack();
    // The program's backward kernels were compiled for a contiguous, 16-byte-aligned dO (O's layout). A
    // broadcast upstream gradient (o.sum() gives stride-0 ones) becomes dense here, as in the Python path.
    if (!grad_out.is_contiguous() || reinterpret_cast<uintptr_t>(grad_out.data_ptr()) % 16 != 0) {
      grad_out = grad_out.clone(at::MemoryFormat::Contiguous);
    }
    TORCH_CHECK(grad_out.sizes() == t[OUT].sizes() && grad_out.scalar_type() == t[OUT].scalar_type(),
                "flash_autograd: upstream gradient of shape ", grad_out.sizes(), " and dtype ",
                grad_out.scalar_type(), " for an output of shape ", t[OUT].sizes(), " and dtype ",
                t[OUT].scalar_type());
    t[GRAD_OUT] = grad_out;
    t[DELTA] = at::empty_like(t[LSE]);
    t[GRAD_Q] = at::empty_like(t[Q]);
    t[GRAD_K] = at::empty_like(t[K]);
    t[GRAD_V] = at::empty_like(t[V]);
    for (int64_t slot : program->zeroed) t[slot].zero_();
    if (program->dq_accumulator > 0) t[DQ_ACC] = at::empty({program->dq_accumulator}, t[Q].options().dtype(at::kFloat));
    launch_all(program->backward, t, *program, stream_of(t[Q]));
    variable_list result{t[GRAD_Q], t[GRAD_K], t[GRAD_V]};
    if (at::GradMode::is_enabled()) {
      // As torch.autograd.function.once_differentiable: a second backward through these gradients fails
      // when it is taken, not silently.
      auto error = make_node<torch::autograd::Error>(
          "FlashAttentionTriton's backward is not differentiable twice",
          torch::autograd::collect_next_edges(grads[0], t[Q], t[K], t[V]));
      torch::autograd::set_history(result, error);
    }
    return result;
  }
};

// Programs by input geometry. The key holds everything a program was derived from: per input the sizes,
// strides, dtype and whether its address is 16-byte aligned; the device, causality, the fp32 matmul
// precision and the current stream (a program's workspaces serve one stream). A null program marks a
// geometry the Python path serves (native.py).
using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& key) const noexcept {
    size_t h = key.size();
    for (int64_t x : key) h ^= std::hash<int64_t>()(x) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

constexpr size_t MAX_PROGRAMS = 4096;
std::mutex registry_mutex;
std::unordered_map<Key, std::shared_ptr<const Program>, KeyHash> registry;

void append_geometry(Key& key, const at::Tensor& t) {
  key.push_back(t.dim());
  for (int64_t s : t.sizes()) key.push_back(s);
  for (int64_t s : t.strides()) key.push_back(s);
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0);
}

Key make_key(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal, void* stream) {
  Key key;
  key.reserve(40);
  append_geometry(key, q);
  append_geometry(key, k);
  append_geometry(key, v);
  key.push_back(q.device().index());
  key.push_back(k.device() == q.device() && v.device() == q.device());
  key.push_back(is_causal);
  key.push_back(static_cast<int64_t>(at::globalContext().float32MatmulPrecision()));
  key.push_back(reinterpret_cast<int64_t>(stream));
  return key;
}

bool usable(const at::Tensor& t) { return t.defined() && t.is_cuda() && !t._is_zerotensor(); }

// Returns O; None where no program is registered for this geometry yet (Python derives one and calls
// `register_program`), False where the geometry belongs to the Python path or the stream is capturing
// a CUDA graph (a program's split-key workspace serves eager launches on one stream).
py::object forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal) {
  if (!(usable(q) && usable(k) && usable(v))) return py::bool_(false);
  void* stream = stream_of(q);
  int capturing = 0;
  if (driver().is_capturing(stream, &capturing) != 0 || capturing != 0) return py::bool_(false);
  std::shared_ptr<const Program> program;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto found = registry.find(make_key(q, k, v, is_causal, stream));
    if (found == registry.end()) return py::none();
    program = found->second;
  }
  if (!program) return py::bool_(false);
  Tensors t;
  t[Q] = q;
  t[K] = k;
  t[V] = v;
  t[OUT] = at::empty(q.sizes(), q.options());
  t[LSE] = at::empty(q.sizes().slice(0, q.dim() - 1), q.options().dtype(at::kFloat));
  launch_all(program->forward, t, *program, stream);
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    auto node = make_node<FlashBackward>();
    node->program = program;
    node->is_causal = is_causal;
    node->set_next_edges(torch::autograd::collect_next_edges(q, k, v));
    torch::autograd::set_history(t[OUT], node);
    node->q_ = SavedVariable(q, false);
    node->k_ = SavedVariable(k, false);
    node->v_ = SavedVariable(v, false);
    // O's data, not O: saved as the node's own output it would need the node's pointer to unpack, whose
    // type differs across PyTorch versions. A detached alias shares O's storage and version counter, so
    // an in-place change of O before the backward is still caught, and it holds no reference to the node.
    node->out_ = SavedVariable(t[OUT].detach(), false);
    node->lse_ = SavedVariable(t[LSE], false);
  }
  return py::cast(t[OUT]);
}

std::vector<Launch> to_launches(const py::list& specs) {
  std::vector<Launch> out;
  for (const py::handle& item : specs) {
    auto spec = item.cast<py::dict>();
    Launch launch;
    launch.name = spec["name"].cast<std::string>();
    launch.function = reinterpret_cast<void*>(spec["function"].cast<uint64_t>());
    auto grid = spec["grid"].cast<std::vector<int64_t>>();
    TORCH_CHECK(grid.size() == 3, "flash_autograd: ", launch.name, ": a grid has 3 dimensions");
    for (size_t i = 0; i < 3; ++i) launch.grid[i] = static_cast<unsigned>(grid[i]);
    launch.threads = spec["threads"].cast<unsigned>();
    launch.shared = spec["shared"].cast<unsigned>();
    launch.scratch_bytes = spec["scratch_bytes"].cast<int64_t>();
    if (spec.contains("maps")) {
      for (const py::handle& entry : spec["maps"].cast<py::list>()) {
        auto m = entry.cast<py::dict>();
        TensorMap map;
        map.slot = m["slot"].cast<int64_t>();
        map.dtype = m["dtype"].cast<int>();
        map.swizzle = m["swizzle"].cast<int>();
        map.fill = m["fill"].cast<int>();
        auto dims = m["dims"].cast<std::vector<uint64_t>>();
        auto strides = m["strides"].cast<std::vector<uint64_t>>();
        auto box = m["box"].cast<std::vector<uint32_t>>();
        TORCH_CHECK(!dims.empty() && dims.size() <= MAX_RANK && strides.size() + 1 == dims.size() &&
                        box.size() == dims.size(),
                    "flash_autograd: ", launch.name, ": a tensor map of rank ", dims.size(), " with ",
                    strides.size(), " strides and a box of rank ", box.size());
        map.rank = static_cast<uint32_t>(dims.size());
        std::copy(dims.begin(), dims.end(), map.dims.begin());
        std::copy(strides.begin(), strides.end(), map.strides.begin());
        std::copy(box.begin(), box.end(), map.box.begin());
        launch.maps.push_back(map);
      }
      TORCH_CHECK(launch.maps.size() <= MAX_MAPS, "flash_autograd: ", launch.name, " has ", launch.maps.size(),
                  " tensor maps, more than ", MAX_MAPS);
      TORCH_CHECK(launch.maps.empty() || driver().encode_tiled != nullptr, "flash_autograd: ", launch.name,
                  ": this driver has no cuTensorMapEncodeTiled (CUDA 12+)");
    }
    for (const auto& p : spec["params"].cast<std::vector<std::pair<int64_t, int64_t>>>()) {
      TORCH_CHECK(p.first >= TENSOR && p.first <= TENSOR_MAP, "flash_autograd: ", launch.name,
                  ": unknown parameter kind ", p.first);
      TORCH_CHECK(p.first != TENSOR_MAP || (p.second >= 0 && p.second < static_cast<int64_t>(launch.maps.size())),
                  "flash_autograd: ", launch.name, ": tensor map ", p.second, " of ", launch.maps.size());
      launch.params.push_back(Param{p.first, p.second});
    }
    TORCH_CHECK(launch.params.size() <= MAX_PARAMS, "flash_autograd: ", launch.name, " takes ",
                launch.params.size(), " parameters, more than ", MAX_PARAMS);
    out.push_back(std::move(launch));
  }
  return out;
}

// Registers the program for the geometry of (q, k, v, is_causal) on the current stream; `forward_specs`
// None marks the geometry as the Python path's. A launch spec is a dict: name, function (CUfunction
// address), grid (3 ints), threads, shared (bytes), scratch_bytes, params [(kind, value)], and where a
// TENSOR_MAP parameter indexes them, maps [{slot, dtype, dims, strides, box, swizzle, fill}]. `zeroed`: the
// gradient slots the backward zeroes before its launches (kernels that split their loop add into them);
// `dq_accumulator`: the fp32 elements of the backward's DQ_ACC slot (0: no such slot).
void register_program(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
                      const py::object& forward_specs, const py::object& backward_specs,
                      const std::vector<at::Tensor>& held, const std::vector<int64_t>& zeroed,
                      int64_t dq_accumulator) {
  std::shared_ptr<const Program> program;
  if (!forward_specs.is_none()) {
    auto made = std::make_shared<Program>();
    made->forward = to_launches(forward_specs.cast<py::list>());
    made->backward = to_launches(backward_specs.cast<py::list>());
    made->held = held;
    for (int64_t slot : zeroed) {
      TORCH_CHECK(slot == GRAD_Q || slot == GRAD_K || slot == GRAD_V, "flash_autograd: only gradients are zeroed, got slot ",
                  slot);
    }
    made->zeroed = zeroed;
    TORCH_CHECK(dq_accumulator >= 0, "flash_autograd: a dQ accumulator of ", dq_accumulator, " elements");
    made->dq_accumulator = dq_accumulator;
    for (const auto* launches : {&made->forward, &made->backward}) {
      for (const Launch& launch : *launches) {
        auto in_range = [&](int64_t slot) { return slot >= 0 && slot < HELD + static_cast<int64_t>(held.size()); };
        for (const Param& p : launch.params) {
          TORCH_CHECK(p.kind != TENSOR || in_range(p.value), "flash_autograd: ", launch.name, ": tensor slot ",
                      p.value, " out of range");
        }
        for (const TensorMap& map : launch.maps) {
          TORCH_CHECK(in_range(map.slot), "flash_autograd: ", launch.name, ": tensor map of slot ", map.slot,
                      " out of range");
        }
      }
    }
    program = made;
  }
  std::lock_guard<std::mutex> lock(registry_mutex);
  // Each new stream adds its geometries (notebook 10 times its CUDA-graph captures on a fresh stream per
  // configuration): past this many the registry starts over, as the Python path's plan caches do.
  if (registry.size() >= MAX_PROGRAMS) registry.clear();
  registry[make_key(q, k, v, is_causal, stream_of(q))] = program;
}

void clear() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry.clear();
}

// Whether the driver encodes TMA descriptors (the Gluon kernels' programs need it); false without a driver.
bool tensor_maps_supported() {
  try {
    return driver().encode_tiled != nullptr;
  } catch (const c10::Error&) {
    return false;
  }
}

size_t size() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return registry.size();
}

// `grad_fn.saved_tensors` of a FlashBackward node, as a Python autograd.Function's: (L, Q, K, V, O), the
// order FlashAttentionTriton saves them in (the course's tests look for L there). After the backward has
// released them, unpacking raises the engine's own error. `grad_fn.is_causal`, as FlashAttentionTriton's ctx.
PyObject* saved_tensors(PyObject* self, void*) {
  try {
    auto* node = static_cast<FlashBackward*>(reinterpret_cast<torch::autograd::THPCppFunction*>(self)->cdata.get());
    py::tuple out = py::make_tuple(node->lse_.unpack(), node->q_.unpack(), node->k_.unpack(), node->v_.unpack(),
                                   node->out_.unpack());
    return out.release().ptr();
  } catch (const std::exception& err) {
    PyErr_SetString(PyExc_RuntimeError, err.what());
    return nullptr;
  }
}

using torch::autograd::THPCppFunction_input_metadata;  // named by THP_FUNCTION_DEFAULT_PROPERTIES
using torch::autograd::THPCppFunction_metadata;
using torch::autograd::THPCppFunction_next_functions;
using torch::autograd::THPCppFunction_requires_grad;

PyObject* causal(PyObject* self, void*) {
  auto* node = static_cast<FlashBackward*>(reinterpret_cast<torch::autograd::THPCppFunction*>(self)->cdata.get());
  return PyBool_FromLong(node->is_causal);
}

PyGetSetDef flash_backward_properties[] = {
    THP_FUNCTION_DEFAULT_PROPERTIES,
    {(char*)"saved_tensors", saved_tensors, nullptr, nullptr, nullptr},
    {(char*)"is_causal", causal, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};
PyTypeObject flash_backward_type;

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // grad_fn of an output: a Python type with the engine's default properties plus saved_tensors.
  torch::autograd::_initFunctionPyTypeObject(flash_backward_type, "FlashAttentionNativeBackward",
                                             flash_backward_properties, nullptr);
  Py_INCREF(&flash_backward_type);
  torch::autograd::registerCppFunction(typeid(FlashBackward), &flash_backward_type);
  m.doc() = "FlashAttention-2's eager autograd node: the Triton kernels' launches in C++ (attention/launch/native.py)";
  m.def("forward", &forward, "O of (q, k, v, is_causal) by the registered program; None: none registered; "
        "False: the Python path's", py::arg("q"), py::arg("k"), py::arg("v"), py::arg("is_causal"));
  m.def("register_program", &register_program, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("is_causal"),
        py::arg("forward_specs"), py::arg("backward_specs"), py::arg("held"), py::arg("zeroed"),
        py::arg("dq_accumulator") = 0);
  m.def("clear", &clear, "forget every program");
  m.def("size", &size, "the number of geometries registered");
  m.def("tensor_maps_supported", &tensor_maps_supported, "whether the driver encodes TMA descriptors");
  m.attr("TENSOR") = static_cast<int64_t>(TENSOR);
  m.attr("I32") = static_cast<int64_t>(I32);
  m.attr("I64") = static_cast<int64_t>(I64);
  m.attr("I8") = static_cast<int64_t>(I8);
  m.attr("SCRATCH") = static_cast<int64_t>(SCRATCH);
  m.attr("NULL_POINTER") = static_cast<int64_t>(NULL_POINTER);
  m.attr("TENSOR_MAP") = static_cast<int64_t>(TENSOR_MAP);
  py::dict slots;
  for (auto [name, slot] : {std::pair<const char*, int64_t>{"q", Q}, {"k", K}, {"v", V}, {"out", OUT}, {"lse", LSE},
                            {"grad_out", GRAD_OUT}, {"delta", DELTA}, {"grad_q", GRAD_Q}, {"grad_k", GRAD_K},
                            {"grad_v", GRAD_V}, {"dq_acc", DQ_ACC}, {"held", HELD}}) {
    slots[name] = slot;
  }
  m.attr("SLOTS") = slots;
}
