// polykv._core.Client / Session / Page / Block: libpolykv_client
// (client/include/polykv/client.h) as Python objects. Every RPC releases the
// GIL. A page's memory is a NumPy view into the daemon's shared pool,
// zero-copy; the view keeps its Session object (and so the mapping) alive.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/python/src/bindings.h"
#include "polykv/client.h"

namespace polykv::python {
namespace {

using FloatArray = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U8Array = nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>;
using nb::call_guard;
using Unlocked = call_guard<nb::gil_scoped_release>;

std::vector<float> Floats(const FloatArray& a) { return {a.data(), a.data() + a.shape(0)}; }

std::string FormatOut(kernels::PageFormat f) { return std::string(kernels::FormatShortName(f)); }

nb::dict InfoDict(const SessionInfo& i) {
  nb::dict d;
  d["session_id"] = i.session_id;
  d["num_layers"] = i.num_layers;
  d["block_tokens"] = i.block_tokens;
  d["lease_ms"] = i.lease_ms;
  d["key_format"] = FormatOut(i.key_format);
  d["value_format"] = FormatOut(i.value_format);
  d["key_page_bytes"] = i.key_page_bytes;
  d["value_page_bytes"] = i.value_page_bytes;
  nb::list wanted;
  for (ScoreStream s : policies::AllScoreStreams()) {
    if (i.wants.has(s)) wanted.append(std::string(policies::ScoreStreamName(s)));
  }
  d["wanted_streams"] = wanted;
  d["wants_per_layer"] = i.wants.per_layer;
  d["attention_decay"] = i.wants.attention_decay;
  return d;
}

// A page of blocks() as a writable uint8 view; `owner` is the Python Session.
U8Array PageArray(Session& s, nb::handle owner, size_t block, size_t page) {
  const std::vector<Block>& blocks = s.blocks();
  if (block >= blocks.size() || page >= blocks[block].pages.size()) {
    throw StatusError(absl::OutOfRangeError(absl::StrCat(
        "page (", block, ", ", page, ") is not in the session's ", blocks.size(), " blocks")));
  }
  const Page& p = blocks[block].pages[page];
  if (p.addr == nullptr) {
    throw StatusError(absl::FailedPreconditionError(absl::StrCat(
        "page (", block, ", ", page, ") is not mapped here (an empty entry, in the hole of a ",
        "layer with a budget of its own, or a page in a device arena)")));
  }
  const size_t shape[1] = {p.size_bytes};
  return U8Array(static_cast<uint8_t*>(p.addr), 1, shape, owner);
}

void BindPages(nb::module_& m) {
  nb::class_<Page>(m, "Page", "One K or V page of one layer, mapped into this process.")
      .def_ro("page_id", &Page::page_id)
      .def_ro("arena_id", &Page::arena_id)
      .def_ro("offset", &Page::offset, "Byte offset of the page in its arena.")
      .def_ro("size_bytes", &Page::size_bytes)
      .def_ro("layer", &Page::layer)
      .def_ro("is_value", &Page::is_value)
      .def_prop_ro("format", [](const Page& p) { return FormatOut(p.format); })
      .def_prop_ro("mapped", [](const Page& p) { return p.addr != nullptr; });
  nb::class_<Block>(m, "Block", "block_tokens slots: pages[2*layer] keys, pages[2*layer+1] values.")
      .def_ro("block_index", &Block::block_index)
      .def_ro("pages", &Block::pages);
  nb::class_<SlotMeta>(m, "SlotMeta")
      .def(nb::init<>())
      .def_rw("turn", &SlotMeta::turn)
      .def_prop_rw(
          "role", [](const SlotMeta& s) { return std::string(policies::RoleName(s.role)); },
          [](SlotMeta& s, const std::string& r) { s.role = RoleArg(r); })
      .def_rw("pinned", &SlotMeta::pinned);
}

ScoreStream StreamArg(const std::string& name) {
  if (auto s = policies::ParseScoreStream(name)) return *s;
  std::string known;
  for (ScoreStream s : policies::AllScoreStreams()) {
    absl::StrAppend(&known, known.empty() ? "" : ", ", std::string(policies::ScoreStreamName(s)));
  }
  throw StatusError(absl::InvalidArgumentError(
      absl::StrCat("score stream '", name, "' unknown (", known, ")")));
}

void BindSession(nb::module_& m) {
  nb::class_<Session> session(m, "Session");
  session
      .def_prop_ro("info", [](const Session& s) { return InfoDict(s.info()); })
      .def("reserve", [](Session& s, uint64_t n) { return Take(s.Reserve(n)); },
           nb::arg("num_tokens"), Unlocked(),
           "Pages for num_tokens more tokens; returns the new blocks only.")
      .def("commit", [](Session& s, uint64_t n) { Check(s.Commit(n)); },
           nb::arg("committed_tokens"), Unlocked())
      .def("sync", [](Session& s) { return Take(s.Sync()); }, Unlocked(),
           "Adopts (and acknowledges) a new block table; True when it changed.")
      .def("idle", [](Session& s) { Check(s.Idle()); }, Unlocked(),
           "No page access until the next sync; the session may move meanwhile.")
      .def_prop_ro("moves", &Session::moves)
      .def("release", [](Session& s, uint64_t keep) { Check(s.Release(keep)); },
           nb::arg("keep_tokens"), Unlocked())
      .def("share_prefix",
           [](Session& s, const std::vector<int32_t>& ids) { return Take(s.SharePrefix(ids)); },
           nb::arg("token_ids"), Unlocked())
      .def("attach_prefix",
           [](Session& s, const std::vector<int32_t>& ids) { return Take(s.AttachPrefix(ids)); },
           nb::arg("token_ids"), Unlocked())
      .def("close", [](Session& s) { Check(s.Close()); }, Unlocked())
      .def_prop_ro("blocks", &Session::blocks)
      .def_prop_ro("reserved_tokens", &Session::reserved_tokens)
      .def_prop_ro("committed_tokens", &Session::committed_tokens)
      .def_prop_ro("epoch", &Session::epoch)
      .def_prop_ro("token",
                   [](const Session& s) { return nb::bytes(s.token().data(), s.token().size()); })
      .def_prop_ro("slot_positions", &Session::slot_positions)
      .def_prop_ro("slot_counts", &Session::slot_counts)
      .def_prop_ro("layer_slot_positions", &Session::layer_slot_positions)
      .def(
          "page_array",
          [](nb::handle self, size_t block, size_t page) {
            return PageArray(nb::cast<Session&>(self), self, block, page);
          },
          nb::arg("block"), nb::arg("page"))
      .def(
          "report_slots",
          [](Session& s, uint64_t first, const std::vector<SlotMeta>& meta, uint32_t turn) {
            nb::gil_scoped_release unlocked;
            Check(s.ReportSlots(first, meta, {}, turn));
          },
          nb::arg("first_slot"), nb::arg("meta"), nb::arg("current_turn") = 0)
      .def(
          "report",
          [](Session& s, const std::string& stream, uint64_t first, const FloatArray& values,
             bool per_layer) {
            const ScoreStream st = StreamArg(stream);
            std::vector<float> v = Floats(values);
            nb::gil_scoped_release unlocked;
            Check(s.Report(st, first, std::move(v), per_layer));
          },
          nb::arg("stream"), nb::arg("first_slot"), nb::arg("values"),
          nb::arg("per_layer") = false);
}

void BindConnection(nb::module_& m) {
  nb::class_<Client>(m, "Client")
      .def_static(
          "connect",
          [](const std::string& socket, int timeout_ms) {
            return Take(Client::Connect(socket, timeout_ms));
          },
          nb::arg("socket"), nb::arg("timeout_ms") = 5000, Unlocked())
      .def(
          "open_session",
          [](Client& c, const std::string& agent_id, const std::string& tenant,
             uint32_t num_layers, uint32_t num_kv_heads, uint32_t head_dim,
             const std::string& dtype, const std::string& model_id,
             const std::optional<std::string>& key_format,
             const std::optional<std::string>& value_format, uint32_t block_tokens,
             uint32_t lease_ms, bool heartbeat) {
            SessionOptions o;
            o.agent_id = agent_id;
            o.tenant = tenant;
            o.profile = {num_layers, num_kv_heads, head_dim, DtypeArg(dtype), model_id};
            if (key_format) o.key_format = FormatArg(*key_format, "key_format");
            if (value_format) o.value_format = FormatArg(*value_format, "value_format");
            o.block_tokens = block_tokens;
            o.lease_ms = lease_ms;
            o.heartbeat = heartbeat;
            nb::gil_scoped_release unlocked;
            return Take(c.OpenSession(o));
          },
          nb::arg("agent_id"), nb::arg("tenant"), nb::arg("num_layers"), nb::arg("num_kv_heads"),
          nb::arg("head_dim"), nb::arg("dtype"), nb::arg("model_id"), nb::arg("key_format"),
          nb::arg("value_format"), nb::arg("block_tokens"), nb::arg("lease_ms"),
          nb::arg("heartbeat"));
  m.def(
      "score_streams",
      [] {
        std::vector<std::string> names;
        for (ScoreStream s : policies::AllScoreStreams()) {
          names.emplace_back(policies::ScoreStreamName(s));
        }
        return names;
      },
      "The score streams' names in wire order (policies/score_stream.h).");
  m.def(
      "fetch_arena_fd",
      [](const std::string& fd_socket, uint64_t session_id, const nb::bytes& token,
         uint32_t arena_id) {
        SessionRef ref{session_id, std::string(token.c_str(), token.size())};
        nb::gil_scoped_release unlocked;
        return Take(FetchArenaFd(fd_socket, ref, arena_id));
      },
      nb::arg("fd_socket"), nb::arg("session_id"), nb::arg("token"), nb::arg("arena_id"),
      "Raw: an arena's fd as the daemon hands it to a session (tests and tools).");
}

}  // namespace

void BindClient(nb::module_& m) {
  BindPages(m);
  BindSession(m);
  BindConnection(m);
}

}  // namespace polykv::python
