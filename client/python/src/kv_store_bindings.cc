// polykv._core.KvStore: the reference worker's paged KV store
// (client/worker/paged_kv_store.h) over a polykvd session
// (pool_page_source.h), for polykv.hf. It is the worker's implementation,
// not a second one: the same pages, residual rows, syncs at step boundaries,
// merged-slot bias, attention-mass reports and probes, so a Python session
// is compressed exactly as a worker's is.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/python/src/bindings.h"
#include "client/worker/paged_kv_store.h"
#include "client/worker/pool_page_source.h"

namespace polykv::python {
namespace {

using worker::KvShape;
using worker::PagedKvStore;
using worker::ProbeKind;
using Rows = nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using OutRows = nb::ndarray<float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using Ids = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

ProbeKind ProbeArg(const std::string& kind) {
  if (kind == "intent") return ProbeKind::kIntent;
  if (kind == "reconstruct") return ProbeKind::kReconstruct;
  if (kind == "observation") return ProbeKind::kObservation;
  throw StatusError(absl::InvalidArgumentError(
      absl::StrCat("probe kind '", kind, "' is not intent, reconstruct or observation")));
}

class KvStore {
 public:
  KvStore(const worker::PoolPageSourceOptions& so, const worker::PagedKvStoreOptions& po) {
    auto source = worker::NewPoolPageSource(so);
    Check(source.status());
    store_ = Take(PagedKvStore::Create(po, *std::move(source)));
  }

  void BeginStep(const Ids& ids, const Ids& positions, int32_t turn, const std::string& role) {
    if (ids.shape(0) == 0 || ids.shape(0) != positions.shape(0)) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          "begin_step: ", ids.shape(0), " token ids and ", positions.shape(0),
          " positions (one each, at least one token)")));
    }
    const policies::Role r = RoleArg(role);
    step_.resize(ids.shape(0));
    for (size_t i = 0; i < step_.size(); ++i) {
      step_[i] = worker::StepToken{ids.data()[i], positions.data()[i], turn, r};
    }
    PagedKvStore& store = this->store();
    nb::gil_scoped_release unlocked;
    Check(store.BeginStep(step_));
  }

  void Append(int layer, const Rows& k, const Rows& v) {
    CheckRows("append: k", k, shape().num_kv_heads);
    CheckRows("append: v", v, shape().num_kv_heads);
    PagedKvStore& store = this->store();
    nb::gil_scoped_release unlocked;
    Check(store.Append(layer, k.data(), v.data()));
  }

  void Attend(int layer, const Rows& q, OutRows out) {
    const int heads = static_cast<int>(q.shape(1));
    CheckRows("attend: q", q, heads);
    if (out.shape(0) != q.shape(0) || out.shape(1) != q.shape(1) || out.shape(2) != q.shape(2)) {
      throw StatusError(absl::InvalidArgumentError("attend: out must have q's shape"));
    }
    if (heads <= 0 || heads % shape().num_kv_heads != 0) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          "attend: ", heads, " query heads are not a multiple of ", shape().num_kv_heads,
          " KV heads")));
    }
    PagedKvStore& store = this->store();
    nb::gil_scoped_release unlocked;
    Check(store.Attend(layer, heads, q.data(), out.data()));
  }

  // Closes the session (its pages go back to the pool) and unmaps it.
  void Close() {
    nb::gil_scoped_release unlocked;
    store_.reset();
  }

  PagedKvStore& store() {
    if (!store_) throw StatusError(absl::FailedPreconditionError("the KV store is closed"));
    return *store_;
  }
  const KvShape& shape() { return store().shape(); }

 private:
  template <typename A>
  void CheckRows(const char* what, const A& a, int heads) {
    if (a.shape(0) != step_.size() || a.shape(1) != static_cast<size_t>(heads) ||
        a.shape(2) != static_cast<size_t>(shape().head_dim)) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          what, " is [", a.shape(0), ", ", a.shape(1), ", ", a.shape(2), "], the step wants [",
          step_.size(), ", ", heads, ", ", shape().head_dim, "] (f32, contiguous)")));
    }
  }

  std::unique_ptr<PagedKvStore> store_;
  std::vector<worker::StepToken> step_;
};

}  // namespace

void BindKvStore(nb::module_& m) {
  nb::class_<KvStore>(m, "KvStore")
      .def(
          "__init__",
          [](KvStore* self, const std::string& socket, const std::string& agent_id,
             const std::string& tenant, const std::string& model_id, int num_layers,
             int num_kv_heads, int head_dim, const std::optional<std::string>& key_format,
             const std::optional<std::string>& value_format, int block_tokens,
             int recent_f16_tokens, int threads, int reserve_retry_ms) {
            worker::PoolPageSourceOptions so;
            so.socket = socket;
            so.agent_id = agent_id;
            so.tenant = tenant;
            so.model_id = model_id;
            so.shape = KvShape{num_layers, num_kv_heads, head_dim};
            if (key_format) so.key_format = FormatArg(*key_format, "key_format");
            if (value_format) so.value_format = FormatArg(*value_format, "value_format");
            so.block_tokens = block_tokens;
            worker::PagedKvStoreOptions po;
            po.shape = so.shape;
            po.recent_f16_tokens = recent_f16_tokens;
            po.reserve_retry_ms = reserve_retry_ms;
            po.exec.num_threads = threads;
            nb::gil_scoped_release unlocked;
            new (self) KvStore(so, po);
          },
          nb::arg("socket"), nb::arg("agent_id"), nb::arg("tenant"), nb::arg("model_id"),
          nb::arg("num_layers"), nb::arg("num_kv_heads"), nb::arg("head_dim"),
          nb::arg("key_format"), nb::arg("value_format"), nb::arg("block_tokens"),
          nb::arg("recent_f16_tokens"), nb::arg("threads"), nb::arg("reserve_retry_ms"))
      .def(
          "begin_turn",
          [](KvStore& s, int32_t turn, const std::string& role, const std::string& intent) {
            const policies::Role r = RoleArg(role);
            nb::gil_scoped_release unlocked;
            Check(s.store().BeginTurn(worker::TurnInfo{turn, r, intent}));
          },
          nb::arg("turn"), nb::arg("role"), nb::arg("intent") = "")
      .def("begin_step", &KvStore::BeginStep, nb::arg("token_ids"), nb::arg("positions"),
           nb::arg("turn"), nb::arg("role"))
      .def("append", &KvStore::Append, nb::arg("layer"), nb::arg("k"), nb::arg("v"))
      .def("attend", &KvStore::Attend, nb::arg("layer"), nb::arg("q"), nb::arg("out"))
      .def("end_step",
           [](KvStore& s) {
             nb::gil_scoped_release unlocked;
             Check(s.store().EndStep());
           })
      .def("supports_probe",
           [](KvStore& s, const std::string& kind) {
             return s.store().SupportsProbe(ProbeArg(kind));
           })
      .def("begin_probe",
           [](KvStore& s, const std::string& kind) {
             const ProbeKind k = ProbeArg(kind);
             nb::gil_scoped_release unlocked;
             Check(s.store().BeginProbe(k));
           })
      .def("end_probe",
           [](KvStore& s) {
             nb::gil_scoped_release unlocked;
             Check(s.store().EndProbe());
           })
      .def("close", &KvStore::Close)
      .def("commit_pending",
           [](KvStore& s) {
             nb::gil_scoped_release unlocked;
             Check(s.store().CommitPending());
           })
      .def_prop_ro("num_slots", [](KvStore& s) { return s.store().num_slots(); })
      .def_prop_ro("epoch", [](KvStore& s) { return s.store().epoch(); })
      .def_prop_ro("bytes", [](KvStore& s) { return s.store().bytes(); })
      .def_prop_ro("peak_bytes", [](KvStore& s) { return s.store().peak_bytes(); })
      .def_prop_ro("block_tokens", [](KvStore& s) { return s.store().block_tokens(); })
      .def_prop_ro("name", [](KvStore& s) { return s.store().name(); });
}

}  // namespace polykv::python
