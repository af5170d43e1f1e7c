// polykv._core: what each bindings file registers, and how a failed
// absl::Status becomes a Python exception (polykv.errors, one class per code).
#pragma once

#include <nanobind/nanobind.h>

#include <exception>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "kernels/model_profile.h"
#include "kernels/page_format.h"
#include "policies/session_view.h"

namespace polykv::python {

namespace nb = nanobind;

// A failed call on its way to Python: the translator (errors.cc) raises
// polykv.errors.error_class(code)(message).
class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const char* what() const noexcept override { return what_.c_str(); }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
  std::string what_;
};

inline void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <typename T>
T Take(absl::StatusOr<T> v) {
  Check(v.status());
  return *std::move(v);
}

// Page formats and roles cross as their short names ("int4", "tool_output").
kernels::PageFormat FormatArg(const std::string& name, const char* what);
kernels::DType DtypeArg(const std::string& name);  // f32, f16 or bf16
policies::Role RoleArg(const std::string& name);

void BindErrors(nb::module_& m);
void BindClient(nb::module_& m);
void BindAdmin(nb::module_& m);
void BindKvStore(nb::module_& m);
void BindPrefixCache(nb::module_& m);

}  // namespace polykv::python
