// Argument errors of the C++ core, shared by the ledger and the lookup index: every public method
// throws std::invalid_argument (ValueError in Python) before it changes any state.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace hsd {

// An invalid_argument whose message is the parts streamed one after the other.
template <class... Parts>
std::invalid_argument error(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return std::invalid_argument(out.str());
}

// A per-row argument must have one entry per row.
inline void check_same_length(const char* name, const std::vector<int64_t>& values,
                              const std::vector<int64_t>& rows) {
  if (values.size() != rows.size())
    throw error(name, " has ", values.size(), " entries for ", rows.size(), " rows");
}

}  // namespace hsd
