// The lookup level's n-gram index; see lookup_index.hpp for the contract and the representation.
#include "lookup_index.hpp"

#include "errors.hpp"

#include <algorithm>

namespace hsd {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: every input bit moves every output bit
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

// ------------------------------------------------------------------------------------ LookupIndex
size_t LookupIndex::NgramHash::operator()(int64_t end) const {
  uint64_t h = mix(static_cast<uint64_t>(n));
  for (int64_t i = end - n + 1; i <= end; ++i) h = mix(h ^ static_cast<uint64_t>(index->tokens_[i]));
  return static_cast<size_t>(h);
}

bool LookupIndex::NgramEqual::operator()(int64_t a, int64_t b) const {
  const int64_t* tokens = index->tokens_.data();
  return std::equal(tokens + a - n + 1, tokens + a + 1, tokens + b - n + 1);
}

LookupIndex::LookupIndex(int64_t max_ngram, int64_t min_ngram)
    : max_ngram_(max_ngram), min_ngram_(min_ngram) {
  if (min_ngram < 1 || min_ngram > max_ngram || max_ngram > kMaxNgram)
    throw error("need 1 <= min_ngram <= max_ngram <= ", kMaxNgram, " (MAX_NGRAM), got min_ngram=",
                min_ngram, ", max_ngram=", max_ngram);
  sizes_.reserve(static_cast<size_t>(max_ngram - min_ngram + 1));
  for (int64_t n = max_ngram; n >= min_ngram; --n)
    sizes_.push_back(Size{n, LastEnds(0, NgramHash{this, n}, NgramEqual{this, n}), {}});
}

void LookupIndex::extend(const int64_t* tokens, int64_t count) {
  if (count < 0) throw error("cannot extend by ", count, " tokens");
  for (int64_t j = 0; j < count; ++j) {
    tokens_.push_back(tokens[j]);
    const int64_t end = size() - 1;
    for (Size& s : sizes_) {
      if (s.n > end + 1) {  // no n-gram of this size ends here
        s.before.push_back(-1);
        continue;
      }
      const auto found = s.last_end.find(end);  // an equal n-gram that ended earlier
      if (found == s.last_end.end()) {
        s.before.push_back(-1);
      } else {
        s.before.push_back(*found);
        s.last_end.erase(found);
      }
      s.last_end.insert(end);
    }
  }
}

void LookupIndex::truncate(int64_t length) {
  if (length < 0 || length > size()) throw error("cannot truncate ", size(), " tokens to ", length);
  // Latest position first: each removed n-gram is then its key's last end, and the link popped with
  // it is the last end to put back. The tokens go last: the sets read them while erasing.
  for (int64_t end = size() - 1; end >= length; --end) {
    for (Size& s : sizes_) {
      const int64_t previous = s.before.back();
      s.before.pop_back();
      if (s.n > end + 1) continue;
      s.last_end.erase(end);
      if (previous >= 0) s.last_end.insert(previous);
    }
  }
  tokens_.resize(static_cast<size_t>(length));
}

int64_t LookupIndex::propose(int64_t k, int64_t* out) const {
  if (k < 0) throw error("k must be >= 0, got ", k);
  const int64_t last = size() - 1;
  for (const Size& s : sizes_) {
    if (s.n > last) continue;  // the suffix needs an earlier occurrence, so n <= N - 1
    // Where the suffix (the n-gram ending at N - 1) ended before: e <= N - 2, so at least one
    // token, tokens_[e + 1], follows it.
    const int64_t previous = s.before[static_cast<size_t>(last)];
    if (previous < 0) continue;
    // What followed, read on into the proposal itself where the sequence ends first (an overlapping
    // copy, as LZ77's): in a loop of period p the latest occurrence is p tokens back, and cut at the
    // end the proposal would never be longer than p whatever k is.
    const int64_t period = last - previous;
    for (int64_t i = 0; i < k; ++i) {
      out[i] = i < period ? tokens_[static_cast<size_t>(previous + 1 + i)] : out[i - period];
    }
    return k;
  }
  return 0;
}

// ------------------------------------------------------------------------------------ LookupLevel
LookupLevel::LookupLevel(int64_t num_rows, int64_t max_ngram, int64_t min_ngram, const Ints& eos_ids)
    : valid_(static_cast<size_t>(std::max<int64_t>(num_rows, 0)), 0),
      eos_ids_(eos_ids.begin(), eos_ids.end()) {
  if (num_rows < 0) throw error("num_rows must be >= 0, got ", num_rows);
  LookupIndex check(max_ngram, min_ngram);  // the n-gram sizes are refused before any row is built
  rows_.reserve(static_cast<size_t>(num_rows));
  for (int64_t r = 0; r < num_rows; ++r) rows_.push_back(std::make_unique<LookupIndex>(max_ngram, min_ngram));
}

const LookupIndex& LookupLevel::row(int64_t r) const {
  if (r < 0 || r >= num_rows()) throw error("row ", r, " is out of range for ", num_rows(), " rows");
  return *rows_[static_cast<size_t>(r)];
}

void LookupLevel::check_rows(const Ints& rows) const {
  std::vector<bool> seen(rows_.size(), false);
  for (const int64_t r : rows) {
    if (r < 0 || r >= num_rows()) throw error("row ", r, " is out of range for ", num_rows(), " rows");
    if (seen[static_cast<size_t>(r)]) throw error("row ", r, " is listed twice");
    seen[static_cast<size_t>(r)] = true;
  }
}

void LookupLevel::invalidate(const Ints& rows, const Ints& first_changed) {
  check_rows(rows);
  check_same_length("first_changed", first_changed, rows);
  for (const int64_t f : first_changed)
    if (f < 0) throw error("first_changed must be >= 0, got ", f);
  for (size_t i = 0; i < rows.size(); ++i) {
    int64_t& valid = valid_[static_cast<size_t>(rows[i])];
    valid = std::min(valid, first_changed[i]);
  }
}

int64_t LookupLevel::window_start(const Ints& rows) const {
  check_rows(rows);
  int64_t low = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t v = valid_[static_cast<size_t>(rows[i])];
    low = i == 0 ? v : std::min(low, v);
  }
  return low;
}

LookupLevel::Proposals LookupLevel::propose(const Ints& rows, const int64_t* window, int64_t window_width,
                                            const Ints& ends, const Ints& wanted) {
  const int64_t low = window_start(rows);  // checks the rows
  check_same_length("ends", ends, rows);
  check_same_length("wanted", wanted, rows);
  if (window_width < 0) throw error("window_width must be >= 0, got ", window_width);
  int64_t width = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t valid = valid_[static_cast<size_t>(rows[i])];
    if (ends[i] < valid || ends[i] > low + window_width)
      throw error("row ", rows[i], " ends at ", ends[i], ", outside the tokens known to it (", valid,
                  ") and the window's end (", low + window_width, ")");
    if (wanted[i] < 0) throw error("wanted must be >= 0, got ", wanted[i]);
    width = std::max(width, wanted[i]);
  }

  const size_t num = rows.size();
  Proposals out{Ints(num * static_cast<size_t>(width), 0), width, Ints(num, 0), Ints(num, 0)};
  for (size_t i = 0; i < num; ++i) {
    const size_t r = static_cast<size_t>(rows[i]);
    LookupIndex& index = *rows_[r];
    index.truncate(valid_[r]);  // drop what a verification replaced
    const int64_t* row_window = window + static_cast<int64_t>(i) * window_width;
    index.extend(row_window + (valid_[r] - low), ends[i] - valid_[r]);
    valid_[r] = ends[i];
    int64_t* proposal = out.tokens.data() + i * static_cast<size_t>(width);
    int64_t count = index.propose(wanted[i], proposal);
    for (int64_t j = 0; j < count; ++j) {
      if (eos_ids_.count(proposal[j])) {  // nothing is proposed past an EOS
        std::fill(proposal + j + 1, proposal + count, 0);
        count = j + 1;
        out.last_is_eos[i] = 1;
        break;
      }
    }
    out.counts[i] = count;
  }
  return out;
}

}  // namespace hsd
