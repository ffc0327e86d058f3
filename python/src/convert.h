// How the module turns statuses into Python exceptions and numpy arrays into
// spans (python/src/module.cc): the conventions its header comment states.
// Every function here needs the GIL.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace hetps::python {

namespace py = pybind11;

// ---------------------------------------------------------------------------
// Errors

// Raises the hetps.errors class of `s`'s code (GIL held).
[[noreturn]] inline void Raise(const absl::Status& s) {
  const std::string code = absl::StatusCodeToString(s.code());
  py::object cls = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  try {
    py::dict by_code = py::module_::import("hetps.errors").attr("BY_CODE");
    if (by_code.contains(code)) cls = by_code[py::str(code)];
  } catch (const py::error_already_set&) {
    // Imported on its own (not through the hetps package): RuntimeError.
  }
  PyErr_SetString(cls.ptr(), std::string(s.message()).c_str());
  throw py::error_already_set();
}

inline void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *std::move(v);
}

// ---------------------------------------------------------------------------
// Arrays

// `a` as a C-contiguous array of T's; int64 passes for uint64 (same bits).
template <typename T>
py::array Contiguous(const py::handle& a, const char* what) {
  py::array array = py::array::ensure(a);
  if (!array) {
    throw py::type_error(absl::StrCat(what, ": expected a numpy array"));
  }
  const bool same = array.dtype().is(py::dtype::of<T>());
  const bool key_alias = std::is_same_v<T, uint64_t> &&
                         array.dtype().is(py::dtype::of<int64_t>());
  if (!same && !key_alias) {
    throw py::type_error(absl::StrCat(
        what, ": expected dtype ", std::string(py::str(py::dtype::of<T>())),
        ", got ", std::string(py::str(array.dtype()))));
  }
  if (!(array.flags() & py::array::c_style)) {
    array = py::array::ensure(array, py::array::c_style);
  }
  return array;
}

template <typename T>
std::span<const T> ConstSpan(const py::array& a) {
  return {static_cast<const T*>(a.data()), static_cast<size_t>(a.size())};
}

// `out` (given) checked to be a writable float32 array of `size` values, or
// a new one of `shape`.
inline py::array_t<float> Output(const std::optional<py::array>& out,
                          std::vector<py::ssize_t> shape) {
  py::ssize_t size = 1;
  for (py::ssize_t d : shape) size *= d;
  if (!out) return py::array_t<float>(shape);
  py::array a = *out;
  if (!a.dtype().is(py::dtype::of<float>()) ||
      !(a.flags() & py::array::c_style) || !a.writeable()) {
    throw py::type_error("out: expected a writable C-contiguous float32 array");
  }
  if (a.size() != size) {
    throw py::value_error(absl::StrCat("out: expected ", size,
                                       " values, got ", a.size()));
  }
  return py::reinterpret_borrow<py::array_t<float>>(a);
}

// A view of `data` (owned by `owner`) as a numpy array.
template <typename T>
py::array View(const std::vector<T>& data, std::vector<py::ssize_t> shape,
               py::handle owner) {
  return py::array_t<T>(shape, data.data(), owner);
}

}  // namespace hetps::python
