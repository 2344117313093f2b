// Prompt-lookup drafting, the model-free level 0 (docs/design.md, "The lookup level").
//
// Contract. For a row whose sequence `seq` has N tokens, try n from max_ngram down to min_ngram
// (only n <= N - 1): the suffix seq[N-n, N) and its most recent *earlier* occurrence, the largest
// start s with s + n <= N - 1 and seq[s, s+n) == seq[N-n, N) (it may overlap the suffix, but not be
// it). The first n that has one wins; the proposal is k tokens of what followed, seq[s+n, ...),
// read on into the proposal itself where the sequence ends first (an overlapping copy: a loop of
// period p = N - s - n continues). No n matches: nothing is proposed. Specification:
// tests/test_lookup_index.py (a brute-force search the property tests compare against).
//
// Representation. The index follows the row as tokens are appended (extend) and rejected ones
// dropped (truncate), never rebuilt. For each n and each position i, before[n][i] is where the
// n-gram ending at i last ended before i (-1 if nowhere, or if no n-gram ends at i). A proposal reads
// before[n][N-1]: no hashing at all. To fill before[n] in as tokens arrive, a hash set per n holds,
// for every n-gram that occurs, the position where it last ended; the set stores only positions and
// hashes and compares the n tokens that end there, so a key is 8 bytes whatever n is. An append costs
// one set lookup per n, a truncate the same per removed token (it puts back the removed n-gram's
// previous last end), a proposal one read per n plus the tokens copied.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_set>
#include <vector>

namespace hsd {

// The longest n-gram matched (hsd_fast.lookup.MAX_NGRAM): an append hashes n tokens for every size n,
// so a token costs O(max_ngram^2); the bound is checked before anything is allocated.
constexpr int64_t kMaxNgram = 64;

class LookupIndex {
 public:
  using Ints = std::vector<int64_t>;

  LookupIndex(int64_t max_ngram, int64_t min_ngram);
  // The sets' hash and equality read tokens_ through `this`: an index never moves.
  LookupIndex(const LookupIndex&) = delete;
  LookupIndex& operator=(const LookupIndex&) = delete;

  int64_t max_ngram() const { return max_ngram_; }
  int64_t min_ngram() const { return min_ngram_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const Ints& tokens() const { return tokens_; }

  void extend(const int64_t* tokens, int64_t count);  // append and index every n-gram they end
  void truncate(int64_t length);                      // keep the first `length` (0 <= length <= size)
  // Writes at most k (>= 0) proposed tokens to `out`; returns how many.
  int64_t propose(int64_t k, int64_t* out) const;

 private:
  // The n-gram ending at a position, hashed and compared by its n tokens.
  struct NgramHash {
    const LookupIndex* index;
    int64_t n;
    size_t operator()(int64_t end) const;
  };
  struct NgramEqual {
    const LookupIndex* index;
    int64_t n;
    bool operator()(int64_t a, int64_t b) const;
  };
  using LastEnds = std::unordered_set<int64_t, NgramHash, NgramEqual>;

  struct Size {  // one n-gram size n
    int64_t n;
    LastEnds last_end;  // per n-gram that occurs: where it last ended
    Ints before;        // [size]: where the n-gram ending at i last ended before i
  };

  int64_t max_ngram_, min_ngram_;
  Ints tokens_;
  std::vector<Size> sizes_;  // n from max_ngram down: the order proposals try them
};

// The lookup level of one run: an index per row and, per row, how many leading tokens its index
// holds unchanged (`valid`): a verification replaces the token at its cut and drops what follows.
class LookupLevel {
 public:
  using Ints = LookupIndex::Ints;

  LookupLevel(int64_t num_rows, int64_t max_ngram, int64_t min_ngram, const Ints& eos_ids);

  int64_t num_rows() const { return static_cast<int64_t>(rows_.size()); }
  const LookupIndex& row(int64_t r) const;
  const Ints& valid() const { return valid_; }

  // A verification of `rows` may have replaced their tokens from first_changed[i] on.
  void invalidate(const Ints& rows, const Ints& first_changed);
  // The first position propose() will read for `rows`: the smallest of their `valid`.
  int64_t window_start(const Ints& rows) const;

  struct Proposals {
    Ints tokens;  // [R, width] row-major, row i's first counts[i] entries proposed, the rest 0
    int64_t width;
    Ints counts;       // [R]
    Ints last_is_eos;  // [R] 0/1: the last proposed token is an EOS (nothing follows one)
  };
  // Brings each row's index up to ends[i] tokens from `window` ([R, window_width] row-major: the
  // tokens at positions [window_start(rows), window_start(rows) + window_width) of rows[i]) and
  // proposes at most wanted[i] tokens for it. Rows must be distinct.
  Proposals propose(const Ints& rows, const int64_t* window, int64_t window_width, const Ints& ends,
                    const Ints& wanted);

 private:
  void check_rows(const Ints& rows) const;

  std::vector<std::unique_ptr<LookupIndex>> rows_;
  Ints valid_;
  std::unordered_set<int64_t> eos_ids_;
};

}  // namespace hsd
