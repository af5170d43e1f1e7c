// polykv._core.PrefixCache: the prefix cache without a session, for an
// engine's connector (client/include/polykv/prefix_cache.h). Pages cross as
// bytes; polykv/prefix_cache.py wraps it.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "client/python/src/bindings.h"
#include "polykv/prefix_cache.h"

namespace polykv::python {
namespace {

using Unlocked = nb::call_guard<nb::gil_scoped_release>;

v1::PrefixSpace Space(const std::string& tenant, uint32_t num_layers, uint32_t num_kv_heads,
                      uint32_t head_dim, const std::string& dtype, const std::string& model_id,
                      const std::optional<std::string>& key_format,
                      const std::optional<std::string>& value_format, uint32_t block_tokens) {
  v1::PrefixSpace s;
  s.set_tenant(tenant);
  v1::ModelProfile* p = s.mutable_profile();
  p->set_num_layers(num_layers);
  p->set_num_kv_heads(num_kv_heads);
  p->set_head_dim(head_dim);
  p->set_dtype(static_cast<v1::DType>(DtypeArg(dtype)));
  p->set_model_id(model_id);
  // The proto's page formats have the kernels' wire values.
  if (key_format) s.set_key_format(static_cast<v1::PageFormat>(FormatArg(*key_format, "key_format")));
  if (value_format) {
    s.set_value_format(static_cast<v1::PageFormat>(FormatArg(*value_format, "value_format")));
  }
  s.set_block_tokens(block_tokens);
  return s;
}

}  // namespace

void BindPrefixCache(nb::module_& m) {
  nb::class_<v1::PrefixSpace>(m, "PrefixSpace");
  m.def("prefix_space", &Space, nb::arg("tenant"), nb::arg("num_layers"),
        nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("dtype"), nb::arg("model_id"),
        nb::arg("key_format"), nb::arg("value_format"), nb::arg("block_tokens"));
  nb::class_<PrefixCacheClient>(m, "PrefixCache")
      .def_static(
          "connect",
          [](const std::string& socket, int timeout_ms) {
            return Take(PrefixCacheClient::Connect(socket, timeout_ms));
          },
          nb::arg("socket"), nb::arg("timeout_ms"), Unlocked())
      .def(
          "lookup",
          [](PrefixCacheClient& c, const v1::PrefixSpace& space,
             const std::vector<int32_t>& ids) { return Take(c.Lookup(space, ids)); },
          Unlocked())
      .def(
          "read",
          [](PrefixCacheClient& c, const v1::PrefixSpace& space, const std::vector<int32_t>& ids,
             uint64_t first_block, uint32_t max_blocks) {
            v1::ReadPrefixResponse r;
            {
              nb::gil_scoped_release unlocked;
              r = Take(c.Read(space, ids, first_block, max_blocks));
            }
            nb::list pages;
            for (const std::string& p : r.pages()) pages.append(nb::bytes(p.data(), p.size()));
            return std::make_tuple(r.first_block(), r.blocks(), pages);
          })
      .def("store",
           [](PrefixCacheClient& c, const v1::PrefixSpace& space, const std::vector<int32_t>& ids,
              uint64_t first_block, const std::vector<nb::bytes>& pages) {
             std::vector<std::string> copy;
             copy.reserve(pages.size());
             for (const nb::bytes& p : pages) copy.emplace_back(p.c_str(), p.size());
             nb::gil_scoped_release unlocked;
             return Take(c.Store(space, ids, first_block, copy));
           });
}

}  // namespace polykv::python
