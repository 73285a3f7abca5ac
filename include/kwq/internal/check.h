// File: kwq/internal/check.h
//
// KWQ_CHECK / KWQ_DCHECK: invariant and misuse checks. A failed check prints the
// condition, the message and the source location to stderr and aborts. KWQ_DCHECK is
// compiled out when NDEBUG is defined (Release); kwq's API returns absl::Status for bad
// input, and uses these only for programming errors such as using a moved-from handle.
// Internal: kwq users must not depend on this header.

#ifndef KWQ_INTERNAL_CHECK_H_
#define KWQ_INTERNAL_CHECK_H_

namespace kwq::internal {
[[noreturn]] void CheckFailed(const char* condition, const char* message, const char* file,
                              int line);
}  // namespace kwq::internal

#define KWQ_CHECK(cond, msg)                                          \
  do {                                                                \
    if (!(cond)) [[unlikely]]                                         \
      ::kwq::internal::CheckFailed(#cond, (msg), __FILE__, __LINE__); \
  } while (0)

#ifdef NDEBUG
#define KWQ_DCHECK(cond, msg) \
  do {                        \
  } while (0)
#else
#define KWQ_DCHECK(cond, msg) KWQ_CHECK(cond, msg)
#endif

#endif  // KWQ_INTERNAL_CHECK_H_
