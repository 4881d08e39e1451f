// Status helpers for adaps. Debian's Abseil 20220623 has no RETURN_IF_ERROR-style macros,
// so these three fill the gap. They evaluate their argument exactly once.
#ifndef ADAPS_COMMON_STATUS_MACROS_H_
#define ADAPS_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define ADAPS_STATUS_CONCAT_INNER_(a, b) a##b
#define ADAPS_STATUS_CONCAT_(a, b) ADAPS_STATUS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define ADAPS_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    ::absl::Status adaps_status_ = (expr);          \
    if (!adaps_status_.ok()) return adaps_status_;  \
  } while (0)

// `ADAPS_ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value of a StatusOr or returns its
// status from the enclosing function.
#define ADAPS_ASSIGN_OR_RETURN(lhs, expr) \
  ADAPS_ASSIGN_OR_RETURN_IMPL_(ADAPS_STATUS_CONCAT_(adaps_statusor_, __LINE__), lhs, expr)
#define ADAPS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

// Returns `code` with a message naming the failed condition when `cond` is false. For
// checking input (network, files, flags), never for programmer errors.
#define ADAPS_RET_CHECK(cond, code, msg)                                     \
  do {                                                                       \
    if (!(cond)) return ::absl::Status((code), ::absl::StrCat((msg), " (",  \
                                        #cond, ")"));                        \
  } while (0)

#endif  // ADAPS_COMMON_STATUS_MACROS_H_
