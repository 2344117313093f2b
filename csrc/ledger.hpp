// The nested KV-cache ledger of Hierarchical Speculative Decoding (docs/design.md, "The ledger").
//
// Integers only: per row and level it tracks how many tokens carry each tag, how much of each
// level's KV cache is valid, where an EOS was drawn and the row's length budget. It decides what
// every row wants next (draft, verify a full batch, flush upward, nothing) and what a level must feed;
// the engine moves the tensors. Specification: tests/ledger_model.py (a plain-Python model that the
// property tests compare this class against, observable by observable).
//
// Representation. Tags never increase along a row, so they are stored as *frontiers*:
// frontier(r, l) = number of tokens of row r (prompt included) whose tag is >= l. Hence
// frontier(r, 0) == seq_len, frontier(r, K) == committed length and pending(l) = frontier(l) -
// frontier(l + 1). The prompt is tagged K. cached(r, l) = number of leading positions that level l's
// KV cache holds validly. Every query is O(levels) per row; no state is O(seq_len).
//
// Errors: every public method validates its arguments and throws std::invalid_argument (ValueError in
// Python) before it changes any state, in the same order of checks as the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hsd {

class Ledger {
 public:
  using Ints = std::vector<int64_t>;

  enum class Policy { MostRows, HighestLevel };

  // num_levels = K + 1 (level K is the target); block_sizes[i] = T_i for the draft levels 0..K-1.
  Ledger(int64_t num_levels, const Ints& block_sizes, const Ints& prompt_lens,
         const Ints& max_new_tokens, const std::string& policy = "most_rows");
  // The same max_new_tokens for every row.
  Ledger(int64_t num_levels, const Ints& block_sizes, const Ints& prompt_lens,
         int64_t max_new_tokens, const std::string& policy = "most_rows");

  // --- configuration
  int64_t num_levels() const { return num_levels_; }
  int64_t num_rows() const { return num_rows_; }
  const Ints& block_sizes() const { return block_sizes_; }
  std::string policy() const;

  // --- per-row queries (row and level are range-checked)
  int64_t seq_len(int64_t row) const;
  int64_t committed_len(int64_t row) const;
  int64_t pending(int64_t row, int64_t level) const;  // tokens tagged exactly `level` (0 at the top)
  int64_t last_tag(int64_t row) const;
  Ints tags(int64_t row) const;  // [seq_len]: the tag of every position
  bool finished(int64_t row) const;
  int64_t output_len(int64_t row) const;    // committed length, cut after a committed EOS
  int64_t wanted_level(int64_t row) const;  // -1 once the row is finished, and while it is held
  bool held(int64_t row) const;             // hold() waits it at its round boundary

  // --- bulk views
  const Ints& frontiers() const { return frontier_; }  // [num_rows * num_levels], row-major
  const Ints& cached_lens() const { return cached_; }  // [num_rows * num_levels], row-major
  Ints seq_lens() const;
  Ints output_lens() const;
  const Ints& eos_positions() const { return eos_pos_; }  // -1 where the row holds no EOS
  const Ints& holds() const { return held_; }             // [num_rows]: 1 where the row is held
  bool all_finished() const;
  Ints wanted_levels() const;
  int64_t next_level() const;  // the level to run next under the policy, -1 when none is wanted
  Ints rows_for(int64_t level) const;  // the rows that want `level`, ascending

  // --- what a level feeds: per row, positions [feed_start, feed_end) and the first position whose
  // logits are needed (out_start; logits at position t give the distribution of token t + 1).
  struct Spans {
    Ints feed_start, feed_end, out_start;
  };
  Spans spans(int64_t level, const Ints& rows) const;

  // --- commits
  // Level 0 fed its span and drew one token (tag 0) at position seq_len.
  void commit_draft(const Ints& rows, const Ints& is_eos);

  // Level 0 proposed counts[i] tokens at once (0 up to the room left in its block and in the length
  // budget), the last one an EOS where last_is_eos[i], and closed its block: the row wants level 1
  // next, which verifies whatever is pending, even nothing. The same as counts[i] commit_draft calls
  // followed by the close (a model-free level 0: context lookup, docs/design.md, "The lookup level").
  void commit_proposal(const Ints& rows, const Ints& counts, const Ints& last_is_eos);

  // Level fed its span and verified its block [frontier(level), seq_len) of tag level-1:
  // num_accepted drafts passed, then a correction (on a rejection) or a bonus token follows.
  struct Verified {
    Ints kept_extra;  // 0/1: whether the correction/bonus token was kept (a bonus can be dropped)
    Ints cascaded;    // how many levels below `level` lost cache entries to the rollback
  };
  Verified commit_verify(int64_t level, const Ints& rows, const Ints& num_accepted,
                         const Ints& extra_is_eos);

  // --- switching hierarchies between rounds (docs/design.md, "Holding rows and reconfiguring")
  // A row is at a round boundary when it holds no speculative token (seq_len == committed_len) and
  // level 0's block is not closed. hold() makes such rows (or finished ones) want nothing until the
  // next reconfigure; holding a held row again is allowed.
  void hold(const Ints& rows);
  // Every row finished or held: the ledger becomes one of block_sizes.size() + 1 levels (block sizes
  // >= 1, as the constructor's). cached: [num_rows * new num_levels], row-major, what each new
  // level's cache validly holds of the row's committed prefix: in [0, committed_len - 1] for a held
  // row (each level feeds at least the row's last token, whose logits it needs), in [0,
  // committed_len] for a finished one. Every frontier is the committed length, no block is closed,
  // every hold is released; EOS positions and length budgets are kept.
  void reconfigure(const Ints& block_sizes, const Ints& cached);

 private:
  // Unchecked accessors: callers have validated row and level.
  int64_t& frontier(int64_t row, int64_t level) { return frontier_[row * num_levels_ + level]; }
  int64_t frontier(int64_t row, int64_t level) const { return frontier_[row * num_levels_ + level]; }
  int64_t& cached(int64_t row, int64_t level) { return cached_[row * num_levels_ + level]; }
  int64_t cached(int64_t row, int64_t level) const { return cached_[row * num_levels_ + level]; }
  int64_t top() const { return num_levels_ - 1; }
  int64_t pending_at(int64_t row, int64_t level) const;
  int64_t last_tag_at(int64_t row) const;
  bool finished_at(int64_t row) const;
  int64_t wanted_at(int64_t row) const;

  void check_row(int64_t row) const;
  void check_level(int64_t level) const;
  void check_distinct(const Ints& rows) const;             // duplicates, even out of range
  void check_rows(int64_t level, const Ints& rows) const;  // level, duplicates, range, wanted

  int64_t num_levels_;
  int64_t num_rows_;
  Ints block_sizes_;  // [num_levels - 1]
  Policy policy_;
  Ints budget_end_;  // [num_rows]: prompt_len + max_new_tokens (saturated at INT64_MAX)
  Ints frontier_;    // [num_rows * num_levels]
  Ints cached_;      // [num_rows * num_levels]
  Ints eos_pos_;     // [num_rows]: position of the drawn EOS, -1 if none
  Ints closed_;      // [num_rows]: 1 from commit_proposal until the next commit_verify
  Ints held_;        // [num_rows]: 1 from hold until the next reconfigure
};

}  // namespace hsd
