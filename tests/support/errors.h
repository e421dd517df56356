// What a call throws, as text, for assertions on error messages (every gpt2p::Error names what
// went wrong, where, and how to fix it).
#pragma once

#include <functional>
#include <string>

#include "gpt2p/core/error.h"

namespace gpt2p::testing {

// The message of the gpt2p::Error that `f` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The same with the fix appended: "<message> | hint: <hint>".
inline std::string error_with_hint(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what()) + " | hint: " + e.hint();
  }
  return "(no error)";
}

}  // namespace gpt2p::testing
