// absl::Status -> polykv.errors, and the argument parsers shared by the
// bindings.
#include <nanobind/stl/string.h>

#include "absl/strings/str_cat.h"
#include "client/python/src/bindings.h"

namespace polykv::python {

kernels::PageFormat FormatArg(const std::string& name, const char* what) {
  std::optional<kernels::PageFormat> f = kernels::ParseFormat(name);
  if (!f) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(
        what, " '", name, "' is not a page format (", kernels::FormatShortNames(", "), ")")));
  }
  return *f;
}

kernels::DType DtypeArg(const std::string& name) {
  const kernels::PageFormat d = FormatArg(name, "dtype");
  if (d != kernels::PageFormat::kF32 && d != kernels::PageFormat::kF16 &&
      d != kernels::PageFormat::kBF16) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("dtype '", name, "' is not a compute dtype (f32, f16, bf16)")));
  }
  return static_cast<kernels::DType>(d);  // the same wire values
}

policies::Role RoleArg(const std::string& name) {
  std::optional<policies::Role> r = policies::ParseRole(name);
  if (!r) {
    std::string names;
    for (int i = 0; i < policies::kNumRoles; ++i) {
      const std::string_view role = policies::RoleName(static_cast<policies::Role>(i));
      absl::StrAppend(&names, i ? ", " : "", std::string(role));
    }
    throw StatusError(
        absl::InvalidArgumentError(absl::StrCat("role '", name, "' is not a role (", names, ")")));
  }
  return *r;
}

void BindErrors(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      nb::object cls = nb::module_::import_("polykv.errors")
                           .attr("error_class")(static_cast<int>(e.status().code()));
      PyErr_SetString(cls.ptr(), std::string(e.status().message()).c_str());
    }
  });
  m.def("format_names", [] { return kernels::FormatShortNames(" "); },
        "Every page format's short name, space-separated, in wire order.");
}

}  // namespace polykv::python
