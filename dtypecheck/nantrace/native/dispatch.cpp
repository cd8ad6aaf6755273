// The full trace's per-op work in C++ (issue 30.5): the ops the tracer's Python dispatch mode would be given are
// taken here first, and each one whose record would hold nothing to judge is run, checked and booked without any
// Python; any other op goes on to the Python mode as before, so that every report is the Python path's.
//
// How: torch's Python interpreter entry (``PyInterpreterVTable::dispatch``, what its Python-key fallback calls for
// the mode on top of the stack) is wrapped. When the mode on top is the one ``attach`` marked, ``take_op`` decides:
//
// - ops it cannot vouch for go to the Python mode untouched (unknown to it yet, creating a tensor, a CUDA or
//   subclass argument, a phase change, an in-place target it cannot read or that holds NaN/inf, a user frame only
//   Python can name, and everything while the tracer is stopped, autocast may be on, a non-finite value is being
//   followed or an in-place op's versions are unsettled: the tracer says which in ``_native_state``);
// - the others run here, as the Python mode runs them (the mode popped while they run), and their outputs are
//   read in one pass each. Clean outputs (finite, under ``warn_frac`` of the dtype's max, not mostly below the
//   smallest normal) leave only what the Python judge would have left: the op's count in the window, its history
//   entries and, in the forward, its line on the autograd node it made (``NODE_KEY``);
// - an op that ran here and turned out to need judging is *adopted*: its arguments are put back on the stack and
//   the Python mode is called, and the tracer takes the results (and the in-place targets' checks made before the
//   op ran, with their copies) from ``take`` instead of running the op a second time.
//
// The vtable's list of overrides is the installed torch's: a torch whose interface differs fails to compile this
// file, and nan-trace then runs the Python path alone (native/__init__.py builds it apart from checks.cpp).
#include <ATen/core/PythonFallbackKernel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/PyInterpreter.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_anomaly_mode.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/torch_dispatch_mode.h>
#include <torch/library.h>

#include "tensors.h"

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

namespace py = pybind11;

enum Kind : int { kCheck = 0, kPass = 1, kUninitialised = 2, kScalar = 3 };
enum FrameKind : int { kUser = 0, kInternal = 1, kRunner = 2, kStandIn = 3 };
enum Phase : int { kOther = 0, kForward = 1, kBackward = 2 };

// What ops.classify says of one overload (taught by the tracer the first time the Python mode sees it).
struct OpMeta {
  int kind = kCheck;
  bool creates = false;
  size_t nargs = 0, nret = 0;  // the schema's (read here: ``schema()`` is a call into torch)
  std::vector<size_t> read_mutated;
  std::vector<size_t> written;
  PyObject* name = nullptr;  // OpInfo.name, held
};

// One checked output of an op handled here: a line of the judge's history, handed over at the flush.
struct Entry {
  int64_t index;
  PyObject* name;    // borrowed from its OpMeta
  int phase;
  PyObject* module;  // held
  PyObject* frame;   // held (a FrameKey tuple or None)
  at::ScalarType dtype;
  double absmax;
};

// An in-place target's check before the op ran: as Tracer._before_overwrite takes it.
struct Pre {
  bool checked = false;
  double lo = 0, hi = 0;
  int64_t small = 0, version = 0;
  at::Tensor clone;
};

struct State {
  PyObject* marker = nullptr;  // the mode object (held)
  PyObject* tracer = nullptr;  // held
  PyObject* kind_of = nullptr;   // tracer.frames._kind (held)
  PyObject* node_key = nullptr;  // judge.NODE_KEY (held)
  // By scalar type, from dtypecheck.dtypes (``attach``): the smallest normal of the half-precision formats (their
  // small count; 0 elsewhere) and the largest finite value (near_overflow's limit).
  std::array<double, static_cast<size_t>(at::ScalarType::NumOptions)> tiny{};
  std::array<double, static_cast<size_t>(at::ScalarType::NumOptions)> max{};
  std::unordered_map<const c10::FunctionSchema*, OpMeta> metas;  // never erased: ``meta_cache`` points into it
  // A direct-mapped cache in front of ``metas``: the map's lookup (a division and two dependent loads, often
  // cache misses) was a quarter of take_op's own time in perf's samples of a traced small-op step.
  std::array<std::pair<const c10::FunctionSchema*, const OpMeta*>, 512> meta_cache{};
  std::unordered_map<PyObject*, int> frame_kinds;  // code object (held) -> FrameKind
  PyFrameObject* walked_top = nullptr;  // held: the innermost frame of the last walk that may be reused (user_frame)
  PyObject* walked = nullptr;           // held: that walk's answer
  std::unordered_map<PyObject*, std::unordered_map<int, PyObject*>> frame_keys;  // code -> lasti -> (code, line)
  double warn_frac = 0.5;
  int64_t window = 512, held_limit = 0, cpu_held_limit = 0;
  // The tracer's side, read by ``sync`` whenever it said it may have changed (``stale``).
  std::atomic<bool> stale{true};
  bool fast = false, in_backward = false;
  PyObject* module = nullptr;  // held: modules.current
  PyObject* dominant = nullptr;  // held: flow.dominant (a torch.dtype or None)
  at::ScalarType dominant_type = at::ScalarType::Undefined;  // its scalar type (Undefined for None)
  bool confirmed = false;        // flow.confirmed
  int64_t py_window = 0, py_held = 0, py_held_cpu = 0;
  // This side's share of the window.
  int64_t count = 0, fast_window = 0, fast_held = 0, fast_held_cpu = 0;
  std::vector<Entry> entries;
  // The last forward record run here: autograd gives its output a node only once the op returns, so it is tagged,
  // and its lines' phase settled, at the next op (as the Python mode tags its own: Tracer._tag_pending).
  at::Tensor pending;
  bool pending_grad = false;
  PyObject* pending_origin = nullptr;  // held: (frame, module)
  size_t pending_from = 0;  // its first history entry
  bool py_pending = false;  // the Python mode's last forward record waits for the same (Tracer._tag_pending)
  // An op handed to the Python mode after it ran here.
  bool offered = false;  // the op the Python mode gets next was counted here (``claim``)
  bool adopting = false;
  std::vector<c10::IValue> adopted;
  std::vector<Pre> adopted_pre;
  int64_t ran = 0, forwarded = 0, adoptions = 0;
};

State* S = new State;

// How an op taken here runs: as inside ``__torch_dispatch__`` (the mode's keys off, so that neither the op nor
// what its kernel calls comes back to a mode), by excluding the two Python keys and the front door's (below), which
// costs a bit set where popping the mode off its stack and back cost ~5% of a small-op step
// (``shallow_copy_and_detach`` looks at the same exclusion). Python code (the tracer's callbacks) runs with the mode
// popped instead: it may ask for it.
struct BelowModes {
  c10::impl::ExcludeDispatchKeyGuard keys{
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::Fake})};
};  // never freed: the interpreter may be gone when static destructors run

void clear_entries() {
  for (auto& e : S->entries) {
    Py_XDECREF(e.module);
    Py_XDECREF(e.frame);
  }
  S->entries.clear();
}

using dtypecheck::Extremes;

double tiny_of(at::ScalarType s) { return S->tiny[static_cast<size_t>(s)]; }

double max_of(at::ScalarType s) { return S->max[static_cast<size_t>(s)]; }

// A dtype the tracer checks: one ``attach`` was given limits for (records.CHECKED_DTYPES_NAMES).
bool checked_dtype(at::ScalarType s) { return max_of(s) > 0; }

// Tracer._check's own filter: a floating dtype it checks, strided, not empty, not meta.
bool checkable(const at::Tensor& t) {
  return t.defined() && checked_dtype(t.scalar_type()) && t.layout() == c10::kStrided && t.numel() > 0 &&
         !t.is_meta();
}

bool extremes(const at::Tensor& t, Extremes* out) {
  dtypecheck::Plain p;
  return dtypecheck::plain_of(t, &p) && dtypecheck::extremes_of(p, tiny_of(p.type), out);
}

bool finite(const Extremes& e) {
  return !(std::isnan(e.lo) || std::isnan(e.hi) || e.lo == -INFINITY || e.hi == INFINITY);
}

// Checked.settle's magnitude (finite extremes).
double absmax(const Extremes& e) { return std::fabs(std::max(-e.lo, e.hi)); }

// Tensors of one argument or result, one level down (ops.iter_tensors).
template <typename F>
void each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (t.defined()) f(t);
  } else if (v.isTensorList()) {
    for (const auto& t : v.toTensorVector()) {
      if (t.defined()) f(t);
    }
  } else if (v.isList()) {
    for (const c10::IValue item : v.toListRef()) {
      if (item.isTensor() && item.toTensor().defined()) f(item.toTensor());
    }
  }
}

// A call into the tracer while its mode is popped, as inside ``__torch_dispatch__``: ops it runs are not traced.
py::object call_tracer(const char* method) {
  torch::torch_dispatch_mode::StashTorchDispatchModeGuard popped;
  PyObject* result = PyObject_CallMethod(S->tracer, method, nullptr);
  if (result == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}

// The GIL, taken for the Python side of an op (CPython's own calls: pybind11's guard looks up its internals and
// checks the thread state on top, a few hundred instructions an op).
struct Gil {
  PyGILState_STATE state = PyGILState_Ensure();
  Gil() = default;
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;
  ~Gil() { PyGILState_Release(state); }
};

// Replace what ``slot`` holds with ``value`` (a new reference taken, the old one dropped).
void hold(PyObject*& slot, PyObject* value) {
  Py_INCREF(value);
  Py_XDECREF(slot);
  slot = value;
}

void set_dominant_type(PyObject* dominant) {
  hold(S->dominant, dominant);
  S->dominant_type =
      THPDtype_Check(dominant) ? reinterpret_cast<THPDtype*>(dominant)->scalar_type : at::ScalarType::Undefined;
}

void sync() {
  py::object state = call_tracer("_native_state");
  py::tuple t = state.cast<py::tuple>();
  S->fast = t[0].cast<bool>();
  S->in_backward = t[1].cast<bool>();
  hold(S->module, t[2].ptr());
  S->py_window = t[3].cast<int64_t>();
  S->py_held = t[4].cast<int64_t>();
  S->py_held_cpu = t[5].cast<int64_t>();
  set_dominant_type(t[6].ptr());
  S->confirmed = t[7].cast<bool>();
  S->py_pending = t[8].cast<bool>();
  S->stale = false;
}

// The FrameKey tuple (code, line) of a frame, one object per pair; found by the frame's last instruction, whose line
// costs a walk of the code's line table to work out (a few per cent of a traced step, done once per instruction).
PyObject* frame_key(PyObject* code, PyFrameObject* frame) {
  auto& at = S->frame_keys[code];
  const int lasti = PyFrame_GetLasti(frame);
  auto found = at.find(lasti);
  if (found != at.end()) return found->second;
  const int line = PyFrame_GetLineNumber(frame);
  PyObject* key = nullptr;
  for (const auto& [other, known] : at) {  // another instruction of the same line: the same key
    if (PyLong_AsLong(PyTuple_GET_ITEM(known, 1)) == line) {
      key = known;
      break;
    }
  }
  if (key == nullptr) {
    key = Py_BuildValue("(Oi)", code, line);
    if (key == nullptr) throw py::error_already_set();
  } else {
    Py_INCREF(key);
  }
  at.emplace(lasti, key);
  return key;
}

// FrameFinder.user_frame, from the innermost Python frame: the FrameKey (a new reference; None for the runner's
// own frames or no user frame), or nullptr where only Python can say (a stand-in's local).
PyObject* walk(PyFrameObject* frame);

void forget_walk() {
  Py_CLEAR(S->walked_top);
  Py_CLEAR(S->walked);
}

// The walk's answer for the innermost frame when that frame is torch's or the library's own (an optimizer's loop
// issues hundreds of ops from one frame): while it runs, its callers, and so the user's line, cannot change. The
// frame is held, so that its address is never another activation's; a generator's frame is not kept (each resume
// may come from another caller).
PyObject* user_frame() {
  PyFrameObject* top = PyEval_GetFrame();
  if (top != nullptr && top == S->walked_top) {
    Py_INCREF(S->walked);
    return S->walked;
  }
  PyObject* key = walk(top);
  if (key == nullptr || top == nullptr) return key;
  PyCodeObject* code = PyFrame_GetCode(top);
  const bool generator = code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR);
  const auto kind = S->frame_kinds.find(reinterpret_cast<PyObject*>(code));
  const bool internal = kind != S->frame_kinds.end() && kind->second == kInternal;
  Py_DECREF(code);
  if (internal && !generator) {
    forget_walk();
    Py_INCREF(top);
    S->walked_top = top;
    Py_INCREF(key);
    S->walked = key;
  }
  return key;
}

PyObject* walk(PyFrameObject* frame) {
  Py_XINCREF(frame);
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* c = reinterpret_cast<PyObject*>(code);
    int kind;
    auto found = S->frame_kinds.find(c);
    if (found != S->frame_kinds.end()) {
      kind = found->second;
    } else {
      PyObject* answer = PyObject_CallOneArg(S->kind_of, c);
      if (answer == nullptr) {
        Py_DECREF(code);
        Py_DECREF(frame);
        throw py::error_already_set();
      }
      kind = static_cast<int>(PyLong_AsLong(answer));
      Py_DECREF(answer);
      Py_INCREF(c);  // held: the table's key must never be another code object's address
      S->frame_kinds.emplace(c, kind);
    }
    if (kind == kInternal) {
      PyFrameObject* back = PyFrame_GetBack(frame);
      Py_DECREF(code);
      Py_DECREF(frame);
      frame = back;
      continue;
    }
    PyObject* key = nullptr;
    if (kind == kUser) {
      key = frame_key(c, frame);
      Py_INCREF(key);
    } else if (kind == kRunner) {
      key = Py_None;
      Py_INCREF(key);
    }
    Py_DECREF(code);
    Py_DECREF(frame);
    return key;  // nullptr for a stand-in
  }
  Py_INCREF(Py_None);
  return Py_None;
}

PyObject* metadata_dict(torch::autograd::Node* node) {
  return static_cast<torch::autograd::PyAnomalyMetadata*>(node->metadata())->dict();
}

// judge._grad_fn_of: a view made without grad has no node of its own; a view autograd refuses to regenerate none.
torch::autograd::Node* grad_fn_of(const at::Tensor& t, bool grad_enabled) {
  if (!grad_enabled && t.is_view()) return nullptr;
  try {
    return t.grad_fn().get();
  } catch (const c10::Error&) {
    return nullptr;
  }
}

// Whether DtypeFlow would look at an op's first output: a floating one off the program's dominant dtype (after_op)
// or, for an op that makes a tensor, any floating one until the dominant dtype is confirmed (created_outside).
bool off_dtype(const at::Tensor& result, bool creates) {
  if (!result.defined() || !at::isFloatingType(result.scalar_type())) return false;
  if (result.scalar_type() != S->dominant_type) return true;
  return creates && !S->confirmed;
}

// judge.tag_forward_node for the last forward record run here, before the op that follows it returns (an in-place
// op on its output would give that output a node of its own): its node carries (frame, module) into backward; its
// lines' phase is "forward" when it ran inside a module or made a node, else "other".
void settle_pending() {
  if (S->pending_origin == nullptr) return;
  torch::autograd::Node* grad_fn = S->pending.defined() ? grad_fn_of(S->pending, S->pending_grad) : nullptr;
  if (grad_fn != nullptr && S->pending_grad &&
      PyDict_SetItem(metadata_dict(grad_fn), S->node_key, S->pending_origin) != 0) {
    PyErr_Clear();
  }
  const bool in_module = PyTuple_GET_ITEM(S->pending_origin, 1) != Py_None;
  const int phase = (in_module || grad_fn != nullptr) ? kForward : kOther;
  for (size_t i = S->pending_from; i < S->entries.size(); ++i) S->entries[i].phase = phase;
  Py_CLEAR(S->pending_origin);
  S->pending = at::Tensor();
}

template <typename Args>
void put_back(torch::jit::Stack* stack, size_t base, const Args& args) {
  stack->resize(base);
  for (const auto& v : args) stack->push_back(v);
}

// Forward an op to the Python mode before running it here: the last forward record's node is tagged first (the
// Python mode may read it).
bool forward_now() {
  Gil gil;
  settle_pending();
  ++S->forwarded;
  S->offered = true;
  return false;
}

// What ``learn`` was told of an op, or nullptr.
const OpMeta* meta_of(const c10::FunctionSchema* schema) {
  auto& slot = S->meta_cache[(reinterpret_cast<uintptr_t>(schema) * 0x9E3779B97F4A7C15ull) >> (64 - 9)];
  if (slot.first == schema) return slot.second;
  const auto found = S->metas.find(schema);
  if (found == S->metas.end()) return nullptr;
  slot = {schema, &found->second};
  return slot.second;
}

// Tracer.dispatch at an op of the other phase (forward or not, backward): the last forward record's node is tagged
// and the window judged (``_phase_changed``), as the Python mode does before such an op; false when the op must go
// to the Python mode after all (the judging stopped the run, or the tracer is no longer one this path serves).
bool change_phase(bool backward) {
  Gil gil;
  if (S->py_pending) {
    S->py_pending = false;
    call_tracer("_tag_pending");
  }
  settle_pending();
  {
    torch::torch_dispatch_mode::StashTorchDispatchModeGuard popped;
    PyObject* done = PyObject_CallMethod(S->tracer, "_phase_changed", "O", backward ? Py_True : Py_False);
    if (done == nullptr) throw py::error_already_set();
    Py_DECREF(done);
  }
  sync();
  return S->marker != nullptr && S->fast && backward == S->in_backward;
}

// true: the op was run and booked here; false: the Python mode takes it (with ``S->adopting`` set when it ran here
// already and the stack holds its arguments again). The op runs before the GIL is taken, as in the plain run; what
// needs Python (its line, its node, the history) is done after it, in one hold of the GIL.
bool take_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (S->stale.load()) {
    Gil gil;
    if (S->marker == nullptr) return false;
    sync();
  }
  if (S->marker == nullptr) return false;
  ++S->count;
  if (!S->fast) return forward_now();
  const OpMeta* known = meta_of(&op.schema());
  if (known == nullptr) return forward_now();
  const OpMeta& meta = *known;
  const size_t nargs = meta.nargs;
  if (stack->size() < nargs) return forward_now();
  const size_t base = stack->size() - nargs;
  bool plain = true;
  for (size_t i = base; i < stack->size() && plain; ++i) {
    each_tensor((*stack)[i], [&](const at::Tensor& t) {
      plain &= t.device().is_cpu() && !t.key_set().has(c10::DispatchKey::Python) && !t.is_nested();
    });
  }
  if (!plain) return forward_now();
  const c10::intrusive_ptr<torch::autograd::Node> node = torch::autograd::get_current_node();
  const bool backward = node.defined();
  if (backward != S->in_backward && !change_phase(backward)) return forward_now();
  const bool grad_enabled = at::GradMode::is_enabled();
  const bool record =
      !(meta.kind == kScalar || meta.kind == kUninitialised || (meta.kind == kPass && (backward || !grad_enabled)));
  // Tracer._before_overwrite: an in-place target is checked (and, where the op may be re-run, copied) before.
  const bool keep = grad_enabled || S->module != Py_None;  // the module is read again under the GIL below
  const int64_t held_before = S->py_held + S->fast_held;
  int64_t held = 0, held_cpu = 0;
  std::vector<Pre> pres;
  if (record && !meta.read_mutated.empty()) {
    bool refused = false;
    for (size_t position : meta.read_mutated) {
      each_tensor((*stack)[base + position], [&](const at::Tensor& t) {
        Pre pre;
        if (refused || !checkable(t)) {
          pres.push_back(std::move(pre));
          return;
        }
        Extremes e;
        if (t.is_inference() || !extremes(t, &e) || !finite(e)) {
          refused = true;  // Python checks it with torch, or follows what it holds
          return;
        }
        pre.checked = true;
        pre.lo = e.lo;
        pre.hi = e.hi;
        pre.small = e.small;
        pre.version = static_cast<int64_t>(t.unsafeGetTensorImpl()->version_counter().current_version());
        const int64_t bytes = static_cast<int64_t>(t.nbytes());
        if (keep && held_before + held + bytes <= S->held_limit) {
          BelowModes below;
          pre.clone = t.detach().clone();
          held += bytes;
        }
        pres.push_back(std::move(pre));
      });
    }
    if (refused) return forward_now();
  }
  c10::SmallVector<c10::IValue, 8> args(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  try {
    BelowModes below;
    op.callBoxed(stack);
  } catch (const std::exception&) {
    put_back(stack, base, args);  // the Python mode runs it again, and sees it raise (the dtype-error watch)
    return forward_now();
  }
  const size_t nret = meta.nret;
  const size_t out_base = stack->size() - nret;
  at::Tensor result;
  c10::SmallVector<at::Tensor, 4> outputs;
  for (size_t i = out_base; i < stack->size(); ++i) {
    each_tensor((*stack)[i], [&](const at::Tensor& t) {
      if (!result.defined()) result = t;
      outputs.push_back(t);
    });
  }
  bool adopt = false;
  c10::SmallVector<std::pair<at::Tensor, Extremes>, 4> checks;
  if (record && meta.kind == kCheck) {
    if (outputs.empty()) {  // judge.written_tensors: what an op returning nothing wrote
      for (size_t position : meta.written) each_tensor(args[position], [&](const at::Tensor& t) { outputs.push_back(t); });
    }
    for (const auto& t : outputs) {
      if (!checkable(t)) continue;
      Extremes e;
      if (!extremes(t, &e) || !finite(e)) {
        adopt = true;
        break;
      }
      const double magnitude = absmax(e);
      if (magnitude >= S->warn_frac * max_of(t.scalar_type()) || (e.small && 2 * e.small > t.numel())) {
        adopt = true;  // near_overflow or underflow may warn: the Python judge decides
        break;
      }
      checks.emplace_back(t, e);
    }
  }
  Gil gil;
  if (S->py_pending) {  // the same for the Python mode's last forward record, before this op returns
    S->py_pending = false;
    call_tracer("_tag_pending");
  }
  settle_pending();
  if (S->marker == nullptr || S->stale) {
    // The tracer changed while the op ran (another thread): the Python mode takes it over.
    adopt = true;
  }
  // DtypeFlow.after_op (a record's first output) and created_outside (an op that makes a tensor).
  if (!adopt && (record || meta.creates)) adopt = off_dtype(result, meta.creates);
  py::object frame;
  PyObject* module = S->module;
  if (!adopt && record) {
    // Its line and module as Tracer.dispatch takes them and the flush settles them.
    if (backward) {
      PyObject* origin = PyDict_GetItemWithError(metadata_dict(node.get()), S->node_key);
      if (origin == nullptr && PyErr_Occurred()) throw py::error_already_set();
      if (origin != nullptr && PyTuple_Check(origin) && PyTuple_GET_SIZE(origin) == 2) {
        frame = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(origin, 0));
        module = PyTuple_GET_ITEM(origin, 1);
      }
    }
    if (!frame) {
      PyObject* key = user_frame();
      if (key == nullptr) {
        adopt = true;  // a stand-in's local names it: Python's walk
      } else {
        frame = py::reinterpret_steal<py::object>(key);
      }
    }
  }
  if (adopt) {
    S->adopted.assign(stack->begin() + static_cast<std::ptrdiff_t>(out_base), stack->end());
    S->adopted_pre = std::move(pres);
    S->adopting = true;
    put_back(stack, base, args);
    ++S->adoptions;
    S->offered = true;
    return false;
  }
  if (!record) {
    ++S->ran;
    return true;
  }
  for (const auto& [t, e] : checks) {
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    held += bytes;
    if (t.device().is_cpu()) held_cpu += bytes;
  }
  S->fast_held += held;
  S->fast_held_cpu += held_cpu;
  // Tracer.dispatch: a full window is judged before this op, which opens the next one with its bytes.
  const int64_t in_window = S->py_window + S->fast_window;
  if (in_window > 0 && (in_window >= S->window || S->py_held + S->fast_held >= S->held_limit ||
                        S->py_held_cpu + S->fast_held_cpu >= S->cpu_held_limit)) {
    call_tracer("flush");  // resets both sides (``flushed``); may stop the run (StopTracing)
    if (S->stale) sync();
    S->fast_held = held;
    S->fast_held_cpu = held_cpu;
  }
  ++S->fast_window;
  if (!backward) {
    S->pending = result;
    S->pending_grad = grad_enabled;
    S->pending_origin = PyTuple_Pack(2, frame.ptr(), module);
    if (S->pending_origin == nullptr) throw py::error_already_set();
    S->pending_from = S->entries.size();
  }
  const int phase = kBackward;  // a forward record's lines are settled with its node (settle_pending)
  for (const auto& [t, e] : checks) {
    Py_INCREF(module);
    Py_INCREF(frame.ptr());
    S->entries.push_back(Entry{S->count - 1, meta.name, phase, module, frame.ptr(), t.scalar_type(), absmax(e)});
  }
  ++S->ran;
  return true;
}

// Whether the mode on top of this thread's stack is the one ``attach`` marked.
bool marked_on_top() {
  if (S->marker == nullptr) return false;
  const auto n = c10::impl::TorchDispatchModeTLS::stack_len();
  return n > 0 && c10::impl::TorchDispatchModeTLS::get_stack_at(n - 1)->ptr(getPyInterpreter()) == S->marker;
}

// -- the front door ---------------------------------------------------------------------------------------------
// Reaching this path through torch's Python key costs more than the path's own work: ``PythonTLSSnapshot``'s
// fallback boxes every op at the top of the dispatcher, then ``pythonFallback`` and the interpreter's vtable run
// below autograd (a traced small-op step: ~1.3x of plain with nothing done per op, against ~1.1x for a boxed C++
// fallback alone; benchmarks/bench_boxed_floor.py). So while the marked mode is on top of a thread's stack, that
// thread's included keys are switched from the two Python keys to ``Fake`` (the key just below ``Python``, which
// no tensor carries), whose fallback, ``front_door``, offers the op to ``take_op`` at the same place in the
// dispatch: below autograd, autocast and the other wrappers, as ``pythonFallback`` would have. An op the Python
// mode must take is handed to torch's Python-key fallback from there (``forwarding``), which calls the mode as it
// always does. Anything that pushes a mode (``untraced``, a user's mode, autograd's copy of the thread's state)
// includes the Python keys again: ops then take the old way until the next one through ``Wrapped::dispatch``
// switches back (``open_front_door``). The mode stays on its stack throughout, so that Python sees it as before.
// ``DTYPECHECK_DISPATCH_KEY=0`` keeps the Python key's way (to compare the two; the reports are the same).

// The next op handed to the Python key on this thread was taken by ``front_door``: ``Wrapped::dispatch`` gives it
// to the mode without offering it to ``take_op`` again.
thread_local bool forwarding = false;

bool front_door_wanted = false;  // attach: the fallback is registered and not switched off

void front_door(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

// Register ``front_door`` once (false when torch refuses: a fallback of its own on ``Fake``, in a later torch).
bool register_front_door() {
  static const bool registered = [] {
    try {
      static auto* library =
          new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::Fake, __FILE__, __LINE__);
      library->fallback(torch::CppFunction::makeFromBoxedFunction<&front_door>());
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }();
  return registered;
}

// Ops of this thread come in through ``front_door`` from now on (the marked mode is on top).
void open_front_door() {
  if (!front_door_wanted || !c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Python)) return;
  c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Python, false);
  c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::PythonTLSSnapshot, false);
  c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, true);
}

// Back to torch's way on this thread: the Python keys included again where a mode is on the stack.
void close_front_door() {
  if (!c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Fake)) return;
  c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, false);
  const bool modes = c10::impl::TorchDispatchModeTLS::stack_len() > 0;
  c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Python, modes);
  c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::PythonTLSSnapshot, modes);
}

// torch's own interpreter entry, forwarded everywhere; ``dispatch`` offers the marked mode's ops to ``take_op``.
struct Wrapped final : c10::impl::PyInterpreterVTable {
  const c10::impl::PyInterpreterVTable* base;
  explicit Wrapped(const c10::impl::PyInterpreterVTable* b) : base(b) {}

  std::string name() const override { return base->name(); }
  void incref(PyObject* o) const override { base->incref(o); }
  void decref(PyObject* o) const override { base->decref(o); }
  bool try_incref(const c10::impl::PyObjectSlot& s) const override { return base->try_incref(s); }
  size_t refcnt(PyObject* o) const override { return base->refcnt(o); }
  // A tensor detached while a mode is on (``shallow_copy_and_detach``: what factories and ``make_variable`` do)
  // is detached by the mode on top with ``aten.detach``: for the marked mode, that op is offered to take_op too.
  c10::intrusive_ptr<c10::TensorImpl> detach(const c10::TensorImpl* s) const override {
    if (marked_on_top() && !s->key_set().has(c10::DispatchKey::Python)) {
      static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::detach", "");
      torch::jit::Stack stack;
      stack.emplace_back(at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(const_cast<c10::TensorImpl*>(s))));
      if (take_op(op, &stack)) return stack.back().toTensor().getIntrusivePtr();
    }
    return base->detach(s);
  }
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) const override {
    if (forwarding) {
      forwarding = false;
    } else if (marked_on_top()) {
      open_front_door();
      if (take_op(op, stack)) return;
    }
    base->dispatch(op, stack);
  }
  void reportErrorCallback(PyObject* c, c10::DispatchKey k) const override { base->reportErrorCallback(c, k); }
  void python_op_registration_trampoline(const c10::OperatorHandle& op, c10::DispatchKey k, c10::DispatchKeySet ks,
                                         torch::jit::Stack* s, bool with_keyset, bool with_op) const override {
    base->python_op_registration_trampoline(op, k, ks, s, with_keyset, with_op);
  }
  void throw_abstract_impl_not_imported_error(std::string opname, const char* pymodule,
                                              const char* context) const override {
    base->throw_abstract_impl_not_imported_error(std::move(opname), pymodule, context);
  }
  void python_dispatcher(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* s) const override {
    base->python_dispatcher(op, ks, s);
  }
  bool is_contiguous(const c10::TensorImpl* s, at::MemoryFormat f) const override { return base->is_contiguous(s, f); }
  c10::SymBool sym_is_contiguous(const c10::TensorImpl* s, at::MemoryFormat f) const override {
    return base->sym_is_contiguous(s, f);
  }
  bool is_strides_like(const c10::TensorImpl* s, at::MemoryFormat f) const override {
    return base->is_strides_like(s, f);
  }
  bool is_non_overlapping_and_dense(const c10::TensorImpl* s) const override {
    return base->is_non_overlapping_and_dense(s);
  }
  c10::Device device(const c10::TensorImpl* s) const override { return base->device(s); }
  int64_t dim(const c10::TensorImpl* s) const override { return base->dim(s); }
  c10::IntArrayRef strides(const c10::TensorImpl* s) const override { return base->strides(s); }
  c10::IntArrayRef sizes(const c10::TensorImpl* s) const override { return base->sizes(s); }
  c10::SymIntArrayRef sym_sizes(const c10::TensorImpl* s) const override { return base->sym_sizes(s); }
  c10::Layout layout(const c10::TensorImpl* s) const override { return base->layout(s); }
  int64_t numel(const c10::TensorImpl* s) const override { return base->numel(s); }
  c10::SymInt sym_numel(const c10::TensorImpl* s) const override { return base->sym_numel(s); }
  c10::SymIntArrayRef sym_strides(const c10::TensorImpl* s) const override { return base->sym_strides(s); }
  c10::SymInt sym_storage_offset(const c10::TensorImpl* s) const override { return base->sym_storage_offset(s); }
  void trace_gpu_event_creation(c10::DeviceType d, uintptr_t e) const override {
    base->trace_gpu_event_creation(d, e);
  }
  void trace_gpu_event_deletion(c10::DeviceType d, uintptr_t e) const override {
    base->trace_gpu_event_deletion(d, e);
  }
  void trace_gpu_event_record(c10::DeviceType d, uintptr_t e, uintptr_t s) const override {
    base->trace_gpu_event_record(d, e, s);
  }
  void trace_gpu_event_wait(c10::DeviceType d, uintptr_t e, uintptr_t s) const override {
    base->trace_gpu_event_wait(d, e, s);
  }
  void trace_gpu_memory_allocation(c10::DeviceType d, uintptr_t p) const override {
    base->trace_gpu_memory_allocation(d, p);
  }
  void trace_gpu_memory_deallocation(c10::DeviceType d, uintptr_t p) const override {
    base->trace_gpu_memory_deallocation(d, p);
  }
  void trace_gpu_stream_creation(c10::DeviceType d, uintptr_t s) const override {
    base->trace_gpu_stream_creation(d, s);
  }
  void trace_gpu_device_synchronization(c10::DeviceType d) const override { base->trace_gpu_device_synchronization(d); }
  void trace_gpu_stream_synchronization(c10::DeviceType d, uintptr_t s) const override {
    base->trace_gpu_stream_synchronization(d, s);
  }
  void trace_gpu_event_synchronization(c10::DeviceType d, uintptr_t e) const override {
    base->trace_gpu_event_synchronization(d, e);
  }
  void reset_backward_hooks(const c10::TensorImpl* s) const override { base->reset_backward_hooks(s); }
};

Wrapped* wrapped = nullptr;

void front_door(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (!marked_on_top()) {
    if (c10::impl::TorchDispatchModeTLS::stack_len() == 0) {  // the mode is popped (the tracer's own code) or gone
      op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake), stack);
      return;
    }
    // Another mode is on top: pushed over the marked one (torch includes the Python keys only for a first mode) or
    // uncovered by popping it. Torch's way for this op and what follows, until the marked mode is on top again.
    close_front_door();
    at::impl::MaybeSetTLSOnEntryGuard entry;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Python), stack);
    return;
  }
  if (take_op(op, stack)) return;
  // The Python mode takes it, through torch's Python-key fallback as ever (which reads the thread's dispatch state
  // from when the op came in: taken here, as ``PythonTLSSnapshot``'s fallback would have).
  struct Forwarding {
    Forwarding() { forwarding = true; }
    ~Forwarding() { forwarding = false; }
  } handed;
  at::impl::MaybeSetTLSOnEntryGuard entry;
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Python), stack);
}

// -- the tracer's side ----------------------------------------------------------------------------------------

// Mark ``mode`` (the tracer's dispatch mode object): its ops are offered here until ``detach``. False when another
// tracer holds the hook (a nested one runs the Python path alone).
// ``limits``: (dtype, smallest normal counted as small or 0, largest finite value) of each dtype the tracer checks.
bool attach(py::object mode, py::object tracer, py::object node_key, double warn_frac, int64_t window,
            int64_t held_limit, int64_t cpu_held_limit, std::vector<std::tuple<py::object, double, double>> limits) {
  if (S->marker != nullptr) return false;
  const char* key = std::getenv("DTYPECHECK_DISPATCH_KEY");
  front_door_wanted = !(key != nullptr && std::string(key) == "0") && register_front_door();
  if (wrapped == nullptr) {
    auto* interpreter = getPyInterpreter();
    wrapped = new Wrapped(interpreter->vtable_);
    interpreter->vtable_ = wrapped;  // stays for the process: it forwards everything while nothing is marked
  }
  hold(S->node_key, node_key.ptr());
  S->tiny.fill(0.0);
  S->max.fill(0.0);
  for (const auto& [dtype, tiny, max] : limits) {
    if (!THPDtype_Check(dtype.ptr())) throw py::type_error("limits: a torch.dtype first");
    const auto index = static_cast<size_t>(reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type);
    S->tiny[index] = tiny;
    S->max[index] = max;
  }
  S->tracer = tracer.inc_ref().ptr();
  S->kind_of = py::object(tracer.attr("frames").attr("_kind")).release().ptr();
  S->warn_frac = warn_frac;
  S->window = window;
  S->held_limit = held_limit;
  S->cpu_held_limit = cpu_held_limit;
  S->count = S->fast_window = S->fast_held = S->fast_held_cpu = 0;
  S->py_window = S->py_held = S->py_held_cpu = 0;
  S->offered = S->adopting = S->fast = S->in_backward = false;
  S->adopted.clear();
  S->adopted_pre.clear();
  clear_entries();
  S->pending = at::Tensor();
  Py_CLEAR(S->pending_origin);
  S->py_pending = false;
  S->ran = S->forwarded = S->adoptions = 0;
  S->stale = true;
  S->marker = mode.inc_ref().ptr();
  return true;
}

void detach() {
  if (S->marker == nullptr) return;
  close_front_door();
  front_door_wanted = false;
  settle_pending();
  forget_walk();
  Py_CLEAR(S->marker);
  Py_CLEAR(S->tracer);
  Py_CLEAR(S->kind_of);
  Py_CLEAR(S->module);
  Py_CLEAR(S->dominant);
  S->dominant_type = at::ScalarType::Undefined;
  clear_entries();
  S->adopting = false;
  S->adopted.clear();
  S->adopted_pre.clear();
  for (auto& [code, lines] : S->frame_keys) {
    for (auto& [line, key] : lines) Py_DECREF(key);
  }
  S->frame_keys.clear();
  for (auto& [code, kind] : S->frame_kinds) Py_DECREF(code);
  S->frame_kinds.clear();
}

// What ops.classify said of ``func`` (an OpOverload): its kind, whether it creates a tensor, and the schema
// positions of the arguments it reads and overwrites, and of every one it writes.
void learn(py::object func, int kind, bool creates, std::vector<size_t> read_mutated, std::vector<size_t> written,
           py::object name) {
  py::object schema = func.attr("_schema");
  const auto handle = c10::Dispatcher::singleton().findSchema(
      {schema.attr("name").cast<std::string>(), schema.attr("overload_name").cast<std::string>()});
  if (!handle.has_value()) return;  // not a dispatcher op (stays with the Python mode)
  const c10::FunctionSchema* key = &handle->schema();
  if (S->metas.count(key)) return;
  OpMeta meta;
  meta.kind = kind;
  meta.creates = creates;
  meta.read_mutated = std::move(read_mutated);
  meta.written = std::move(written);
  meta.nargs = key->arguments().size();
  meta.nret = key->returns().size();
  meta.name = name.inc_ref().ptr();
  S->metas.emplace(key, std::move(meta));
}

void stale() { S->stale = true; }

// The program's dominant dtype changed (DtypeFlow.on_change: a model started running).
void set_dominant(py::object dominant, bool confirmed) {
  set_dominant_type(dominant.ptr());
  S->confirmed = confirmed;
}

// The module on top of the tracer's stack changed (ModuleStack.on_change).
void set_module(py::object module) { hold(S->module, module.ptr()); }

int64_t count() { return S->count; }

// The op count for the op the Python mode is running: counted here when it was offered here first; else (torch
// hands some ops to the mode from Python: ``detach``, the profiler's record functions) counted now.
int64_t claim() {
  if (!S->offered) return ++S->count;
  S->offered = false;
  return S->count;
}

// (records, bytes held, CPU bytes held) this side adds to the tracer's window.
py::tuple counters() { return py::make_tuple(S->fast_window, S->fast_held, S->fast_held_cpu); }

// The window was judged: this side's share starts again (its history entries were merged).
void flushed() {
  settle_pending();
  forget_walk();  // a frame held past its return keeps its locals: not longer than a window
  S->fast_window = S->fast_held = S->fast_held_cpu = 0;
  clear_entries();
  S->stale = true;
}

const char* phase_name(int phase) { return phase == kBackward ? "backward" : phase == kForward ? "forward" : "other"; }

// The history entries of ops after ``after`` and before ``before`` (-1: no bound) in op order, only the last
// ``last``: what the judge's history (a deque of ``last``) keeps of them.
py::list entries(int64_t after, int64_t before, int64_t last) {
  settle_pending();
  py::list out;
  if (last <= 0) return out;
  size_t end = S->entries.size();
  if (before >= 0) {
    end = 0;
    while (end < S->entries.size() && S->entries[end].index < before) ++end;
  }
  size_t start = end;
  while (start > 0 && S->entries[start - 1].index > after && static_cast<int64_t>(end - start) < last) --start;
  for (size_t i = start; i < end; ++i) {
    const Entry& e = S->entries[i];
    out.append(py::make_tuple(py::reinterpret_borrow<py::object>(e.name), phase_name(e.phase),
                              py::reinterpret_borrow<py::object>(e.module),
                              py::reinterpret_borrow<py::object>(e.frame),
                              py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(e.dtype))),
                              e.absmax));
  }
  return out;
}

// The op the Python mode is given after it ran here: (its output as ``func(*args)`` returns it, the checks of its
// in-place targets before it ran: (lo, hi, small, version, copy or None), or None for a target not checked), or
// None when the op did not run here.
py::object take() {
  if (!S->adopting) return py::none();
  S->adopting = false;
  py::object out;
  if (S->adopted.size() == 1) {
    out = torch::jit::toPyObject(S->adopted[0]);
  } else {
    py::tuple items(S->adopted.size());
    for (size_t i = 0; i < S->adopted.size(); ++i) items[i] = torch::jit::toPyObject(S->adopted[i]);
    out = items;
  }
  py::list pres;
  for (auto& pre : S->adopted_pre) {
    if (!pre.checked) {
      pres.append(py::none());
      continue;
    }
    py::object clone = pre.clone.defined() ? py::reinterpret_steal<py::object>(THPVariable_Wrap(pre.clone))
                                           : py::none();
    pres.append(py::make_tuple(pre.lo, pre.hi, pre.small, pre.version, clone));
  }
  S->adopted.clear();
  S->adopted_pre.clear();
  return py::make_tuple(out, pres);
}

// (ops run here, ops the Python mode took before running, ops it adopted after running here).
py::tuple stats() { return py::make_tuple(S->ran, S->forwarded, S->adoptions); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attach", &attach);
  m.def("detach", &detach);
  m.def("learn", &learn);
  m.def("stale", &stale);
  m.def("module", &set_module);
  m.def("dominant", &set_dominant);
  m.def("count", &count);
  m.def("claim", &claim);
  m.def("counters", &counters);
  m.def("flushed", &flushed);
  m.def("entries", &entries);
  m.def("take", &take);
  m.def("stats", &stats);
}
