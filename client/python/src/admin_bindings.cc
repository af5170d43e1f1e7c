// polykv._core.Admin: the Admin service (client/include/polykv/admin.h).
// Messages cross as their proto3 JSON (field names as in the .proto, every
// field printed, enums as numbers); polykv/admin.py turns them into
// dataclasses.
#include <google/protobuf/util/json_util.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/python/src/bindings.h"
#include "polykv/admin.h"

namespace polykv::python {
namespace {

using Unlocked = nb::call_guard<nb::gil_scoped_release>;

std::string ToJson(const google::protobuf::Message& msg) {
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.always_print_enums_as_ints = true;  // polykv/admin.py maps them to names
  o.preserve_proto_field_names = true;
  std::string out;
  auto s = google::protobuf::util::MessageToJsonString(msg, &out, o);
  if (!s.ok()) throw StatusError(absl::InternalError(std::string(s.message())));
  return out;
}

// The priority classes' names by wire value, from the proto's own enum:
// PRIORITY_BEST_EFFORT -> "best_effort".
std::string PriorityNames() {
  const google::protobuf::EnumDescriptor* e = v1::PriorityClass_descriptor();
  std::vector<std::string> names;
  for (int n = 0; const auto* v = e->FindValueByNumber(n); ++n) {
    names.push_back(absl::AsciiStrToLower(absl::StripPrefix(v->name(), "PRIORITY_")));
  }
  return absl::StrJoin(names, " ");
}

}  // namespace

void BindAdmin(nb::module_& m) {
  m.def("priority_names", &PriorityNames,
        "The priority classes' names in wire order, space-separated (proto's PriorityClass).");
  nb::class_<AdminClient>(m, "Admin")
      .def_static(
          "connect",
          [](const std::string& socket, int timeout_ms) {
            return Take(AdminClient::Connect(socket, timeout_ms));
          },
          nb::arg("socket"), nb::arg("timeout_ms") = 5000, Unlocked())
      .def("stats_json", [](AdminClient& a) { return ToJson(Take(a.GetStats())); }, Unlocked())
      .def(
          "sessions_json",
          [](AdminClient& a, const std::string& tenant, const std::string& agent) {
            return ToJson(Take(a.ListSessions(tenant, agent)));
          },
          nb::arg("tenant") = "", nb::arg("agent_id") = "", Unlocked())
      .def(
          "get_qos_json",
          [](AdminClient& a, const std::string& agent) { return ToJson(Take(a.GetQos(agent))); },
          nb::arg("agent_id"), Unlocked())
      .def(
          "set_qos_json",
          [](AdminClient& a, const std::string& json) {
            v1::QosRecord q;
            google::protobuf::util::JsonParseOptions o;
            auto s = google::protobuf::util::JsonStringToMessage(json, &q, o);
            if (!s.ok()) {
              throw StatusError(absl::InvalidArgumentError(
                  absl::StrCat("QoS record: ", std::string(s.message()))));
            }
            return ToJson(Take(a.SetQos(q)));
          },
          nb::arg("qos_json"), Unlocked())
      .def(
          "evict", [](AdminClient& a, uint64_t id) { return Take(a.EvictSession(id)); },
          nb::arg("session_id"), Unlocked(), "Evicts a session; returns the bytes freed.")
      .def(
          "drain", [](AdminClient& a, uint32_t ms) { return Take(a.Drain(ms)); },
          nb::arg("evict_after_ms"), Unlocked(),
          "Stops admitting sessions; returns how many were open.")
      .def(
          "move",
          [](AdminClient& a, uint64_t id, const std::string& target, uint32_t wait_ms) {
            return Take(a.MoveSession(id, target, wait_ms)).target_session_id();
          },
          nb::arg("session_id"), nb::arg("target"), nb::arg("wait_ms"), Unlocked(),
          "Moves a session to another polykvd; returns its id there.");
}

}  // namespace polykv::python
