// The ledger state machine; see ledger.hpp for the representation and tests/ledger_model.py for the
// specification. Public methods check their arguments in the model's order, then act; every loop is
// over the given rows (times the levels), so a lockstep step costs O(rows * levels).
#include "ledger.hpp"

#include "errors.hpp"

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace hsd {
namespace {

// Prints a list for an error message; long ones (a batch of 50,000 rows) are cut short.
struct ListOf {
  const Ledger::Ints& values;
};

std::ostream& operator<<(std::ostream& out, const ListOf& list) {
  constexpr size_t kShown = 8;
  out << '[';
  for (size_t i = 0; i < list.values.size() && i < kShown; ++i) out << (i ? ", " : "") << list.values[i];
  if (list.values.size() > kShown) out << ", ... (" << list.values.size() << " entries)";
  return out << ']';
}

bool any_below(const Ledger::Ints& values, int64_t bound) {
  return std::any_of(values.begin(), values.end(), [bound](int64_t v) { return v < bound; });
}

Ledger::Policy parse_policy(const std::string& name) {
  if (name == "most_rows") return Ledger::Policy::MostRows;
  if (name == "highest_level") return Ledger::Policy::HighestLevel;
  throw error("unknown policy '", name, "'; choose one of ('most_rows', 'highest_level')");
}

}  // namespace

// ------------------------------------------------------------------------------------ construction
Ledger::Ledger(int64_t num_levels, const Ints& block_sizes, const Ints& prompt_lens,
               const Ints& max_new_tokens, const std::string& policy)
    : num_levels_(num_levels), num_rows_(static_cast<int64_t>(prompt_lens.size())) {
  if (num_levels < 1) throw error("num_levels must be >= 1, got ", num_levels);
  if (static_cast<int64_t>(block_sizes.size()) != num_levels - 1)
    throw error("block_sizes needs one entry per draft level (", num_levels - 1, "), got ",
                block_sizes.size());
  if (any_below(block_sizes, 1))
    throw error("every block size T must be >= 1, got ", ListOf{block_sizes});
  if (prompt_lens.empty()) throw error("the batch needs at least one row");
  if (max_new_tokens.size() != prompt_lens.size())
    throw error("max_new_tokens has ", max_new_tokens.size(), " entries for ", prompt_lens.size(),
                " rows");
  if (any_below(prompt_lens, 1))
    throw error("every prompt needs at least one token, got ", ListOf{prompt_lens});
  if (any_below(max_new_tokens, 0))
    throw error("max_new_tokens must be >= 0, got ", ListOf{max_new_tokens});
  policy_ = parse_policy(policy);

  block_sizes_ = block_sizes;
  budget_end_.resize(num_rows_);
  for (int64_t r = 0; r < num_rows_; ++r) {
    // Saturate instead of overflowing: a budget beyond INT64_MAX tokens is never reached anyway.
    const int64_t room = std::numeric_limits<int64_t>::max() - prompt_lens[r];
    budget_end_[r] = max_new_tokens[r] > room ? std::numeric_limits<int64_t>::max()
                                              : prompt_lens[r] + max_new_tokens[r];
  }
  // Every prompt token is tagged K (frontier = prompt_len at every level); no cache holds anything.
  frontier_.resize(num_rows_ * num_levels_);
  for (int64_t r = 0; r < num_rows_; ++r)
    std::fill_n(frontier_.begin() + r * num_levels_, num_levels_, prompt_lens[r]);
  cached_.assign(num_rows_ * num_levels_, 0);
  eos_pos_.assign(num_rows_, -1);
  closed_.assign(num_rows_, 0);
  held_.assign(num_rows_, 0);
}

Ledger::Ledger(int64_t num_levels, const Ints& block_sizes, const Ints& prompt_lens,
               int64_t max_new_tokens, const std::string& policy)
    : Ledger(num_levels, block_sizes, prompt_lens, Ints(prompt_lens.size(), max_new_tokens),
             policy) {}

std::string Ledger::policy() const {
  return policy_ == Policy::MostRows ? "most_rows" : "highest_level";
}

// ----------------------------------------------------------------------- unchecked row queries
int64_t Ledger::pending_at(int64_t row, int64_t level) const {
  // Tokens tagged K are committed, not pending for anyone.
  return level < top() ? frontier(row, level) - frontier(row, level + 1) : 0;
}

int64_t Ledger::last_tag_at(int64_t row) const {
  // The highest level whose frontier reaches the end of the row (frontier(row, 0) always does).
  const int64_t end = frontier(row, 0);
  int64_t level = top();
  while (frontier(row, level) != end) --level;
  return level;
}

bool Ledger::finished_at(int64_t row) const {
  const int64_t committed = frontier(row, top());
  const int64_t eos = eos_pos_[row];
  return (0 <= eos && eos < committed) || committed >= budget_end_[row];
}

int64_t Ledger::wanted_at(int64_t row) const {
  if (finished_at(row) || held_[row]) return -1;
  // The highest level with a full batch of tokens waiting below it verifies first.
  for (int64_t level = top(); level >= 1; --level)
    if (pending_at(row, level - 1) >= block_sizes_[level - 1]) return level;
  // A drawn EOS or a full budget stops drafting: flush the speculative tokens upward. The row is
  // not finished, so its last tag is below K and the flush level exists.
  if (eos_pos_[row] >= 0 || frontier(row, 0) >= budget_end_[row]) return last_tag_at(row) + 1;
  // Level 0 closed its block early (it proposed all it had): level 1 verifies what is pending.
  if (closed_[row]) return 1;
  return 0;
}

// -------------------------------------------------------------------------- checked row queries
int64_t Ledger::seq_len(int64_t row) const {
  check_row(row);
  return frontier(row, 0);
}

int64_t Ledger::committed_len(int64_t row) const {
  check_row(row);
  return frontier(row, top());
}

int64_t Ledger::pending(int64_t row, int64_t level) const {
  check_row(row);
  check_level(level);
  return pending_at(row, level);
}

int64_t Ledger::last_tag(int64_t row) const {
  check_row(row);
  return last_tag_at(row);
}

Ledger::Ints Ledger::tags(int64_t row) const {
  check_row(row);
  // Positions [frontier(level + 1), frontier(level)) carry tag `level`; [0, frontier(K)) carry K.
  Ints out(frontier(row, 0));
  int64_t start = 0;
  for (int64_t level = top(); level >= 0; --level) {
    const int64_t end = frontier(row, level);
    if (end > start) std::fill(out.begin() + start, out.begin() + end, level);
    start = std::max(start, end);
  }
  return out;
}

bool Ledger::finished(int64_t row) const {
  check_row(row);
  return finished_at(row);
}

int64_t Ledger::output_len(int64_t row) const {
  check_row(row);
  const int64_t committed = frontier(row, top());
  const int64_t eos = eos_pos_[row];
  return (0 <= eos && eos < committed) ? eos + 1 : committed;
}

int64_t Ledger::wanted_level(int64_t row) const {
  check_row(row);
  return wanted_at(row);
}

bool Ledger::held(int64_t row) const {
  check_row(row);
  return held_[row] != 0;
}

// ------------------------------------------------------------------------------------ bulk views
Ledger::Ints Ledger::seq_lens() const {
  Ints out(num_rows_);
  for (int64_t r = 0; r < num_rows_; ++r) out[r] = frontier(r, 0);
  return out;
}

Ledger::Ints Ledger::output_lens() const {
  Ints out(num_rows_);
  for (int64_t r = 0; r < num_rows_; ++r) out[r] = output_len(r);
  return out;
}

bool Ledger::all_finished() const {
  for (int64_t r = 0; r < num_rows_; ++r)
    if (!finished_at(r)) return false;
  return true;
}

Ledger::Ints Ledger::wanted_levels() const {
  Ints out(num_rows_);
  for (int64_t r = 0; r < num_rows_; ++r) out[r] = wanted_at(r);
  return out;
}

int64_t Ledger::next_level() const {
  Ints count(num_levels_, 0);  // rows wanting each level
  for (int64_t r = 0; r < num_rows_; ++r) {
    const int64_t wanted = wanted_at(r);
    // wanted_at stays in [-1, K] while the state is consistent; checked, never undefined behaviour.
    if (wanted >= num_levels_) throw std::logic_error("hsd ledger: inconsistent state (internal bug)");
    if (wanted >= 0) ++count[wanted];
  }
  int64_t best = -1;
  for (int64_t level = 0; level < num_levels_; ++level) {
    if (count[level] == 0) continue;
    // highest_level: the last wanted level wins. most_rows: the most rows, ties to the higher level.
    if (best < 0 || policy_ == Policy::HighestLevel || count[level] >= count[best]) best = level;
  }
  return best;
}

Ledger::Ints Ledger::rows_for(int64_t level) const {
  check_level(level);
  Ints out;
  for (int64_t r = 0; r < num_rows_; ++r)
    if (wanted_at(r) == level) out.push_back(r);
  return out;
}

Ledger::Spans Ledger::spans(int64_t level, const Ints& rows) const {
  check_rows(level, rows);
  Spans out{Ints(rows.size()), Ints(rows.size()), Ints(rows.size())};
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i];
    const int64_t end = frontier(r, 0);
    out.feed_start[i] = cached(r, level);  // everything it has not cached yet
    out.feed_end[i] = end;
    // Level 0 needs the distribution of the next token only; a verifier needs it at every position
    // of its block [frontier(level), end) plus one more (the bonus).
    out.out_start[i] = level == 0 ? end - 1 : frontier(r, level) - 1;
  }
  return out;
}

// --------------------------------------------------------------------------------------- commits
void Ledger::commit_draft(const Ints& rows, const Ints& is_eos) {
  check_rows(0, rows);
  check_same_length("is_eos", is_eos, rows);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i];
    const int64_t end = frontier(r, 0);
    cached(r, 0) = end;  // level 0 fed everything up to the new token, not the new token itself
    frontier(r, 0) = end + 1;
    if (is_eos[i]) eos_pos_[r] = end;  // drafting stops; the row flushes upward from now on
  }
}

void Ledger::commit_proposal(const Ints& rows, const Ints& counts, const Ints& last_is_eos) {
  if (num_levels_ < 2) throw error("commit_proposal needs a level above level 0 to verify it");
  check_rows(0, rows);
  check_same_length("counts", counts, rows);
  check_same_length("last_is_eos", last_is_eos, rows);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i];
    const int64_t room = std::min(block_sizes_[0] - pending_at(r, 0), budget_end_[r] - frontier(r, 0));
    if (counts[i] < 0 || counts[i] > room)
      throw error("row ", r, ": count ", counts[i], " outside [0, ", room,
                  "] (room in its block and its length budget)");
    if (last_is_eos[i] && counts[i] == 0)
      throw error("row ", r, ": last_is_eos set for an empty proposal");
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i];
    const int64_t end = frontier(r, 0) + counts[i];
    if (counts[i] > 0) cached(r, 0) = end - 1;  // as commit_draft leaves it after the last token
    frontier(r, 0) = end;
    if (last_is_eos[i]) eos_pos_[r] = end - 1;
    closed_[r] = 1;
  }
}

Ledger::Verified Ledger::commit_verify(int64_t level, const Ints& rows, const Ints& num_accepted,
                                       const Ints& extra_is_eos) {
  if (level < 1)
    throw error("commit_verify needs a verifying level >= 1 (level 0 drafts: commit_draft), got ",
                level);
  check_rows(level, rows);
  check_same_length("num_accepted", num_accepted, rows);
  check_same_length("extra_is_eos", extra_is_eos, rows);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i];
    const int64_t drafts = frontier(r, 0) - frontier(r, level);  // the block of tag level - 1
    if (num_accepted[i] < 0 || num_accepted[i] > drafts)
      throw error("row ", r, ": num_accepted ", num_accepted[i], " outside [0, ", drafts,
                  "] (drafts in its block)");
  }

  Verified out{Ints(rows.size()), Ints(rows.size())};
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i];
    const int64_t end = frontier(r, 0);
    cached(r, level) = end;  // it fed the whole row
    const int64_t cut = frontier(r, level) + num_accepted[i];
    int64_t new_len, keep;
    if (cut < end) {
      // Rejection at `cut`: the correction replaces that token and everything after it is gone, so
      // no cache may hold position `cut` or later. Levels above `level` never saw it.
      int64_t lost = 0;
      for (int64_t l = 0; l < level; ++l) lost += cached(r, l) > cut;
      for (int64_t l = 0; l < num_levels_; ++l) cached(r, l) = std::min(cached(r, l), cut);
      if (eos_pos_[r] >= cut) eos_pos_[r] = -1;  // the EOS was rejected: drafting may resume
      out.cascaded[i] = lost;
      new_len = cut + 1;
      keep = 1;
    } else {
      // All drafts passed: a bonus token follows, unless drafting already stopped at an EOS or the
      // length budget is full (then the block is only being flushed upward).
      keep = (eos_pos_[r] != end - 1 && end < budget_end_[r]) ? 1 : 0;
      new_len = end + keep;
    }
    if (keep && extra_is_eos[i]) eos_pos_[r] = new_len - 1;
    // Every token up to new_len now carries a tag >= level.
    for (int64_t l = 0; l <= level; ++l) frontier(r, l) = new_len;
    closed_[r] = 0;  // level 0's block was verified (or cut away): it proposes anew
    out.kept_extra[i] = keep;
  }
  return out;
}

// ------------------------------------------------------------------------- holding, reconfiguring
void Ledger::hold(const Ints& rows) {
  check_distinct(rows);
  for (const int64_t r : rows) {
    check_row(r);
    if (finished_at(r)) continue;  // finished rows are at rest anyway
    const int64_t speculative = frontier(r, 0) - frontier(r, top());
    if (speculative > 0)
      throw error("row ", r, " is not at a round boundary: it holds ", speculative,
                  " speculative tokens");
    if (closed_[r])
      throw error("row ", r, " is not at a round boundary: its proposal waits for level 1");
  }
  for (const int64_t r : rows) held_[r] = 1;
}

void Ledger::reconfigure(const Ints& block_sizes, const Ints& cached) {
  for (int64_t r = 0; r < num_rows_; ++r)
    if (!finished_at(r) && !held_[r])
      throw error("row ", r, " is neither finished nor held: reconfigure needs every row at rest");
  if (any_below(block_sizes, 1))
    throw error("every block size T must be >= 1, got ", ListOf{block_sizes});
  const int64_t levels = static_cast<int64_t>(block_sizes.size()) + 1;
  if (static_cast<int64_t>(cached.size()) != num_rows_ * levels)
    throw error("cached has ", cached.size(), " entries for ", num_rows_, " rows x ", levels,
                " levels");
  for (int64_t r = 0; r < num_rows_; ++r) {
    // A held row runs again: each level feeds at least its last committed token (for its logits).
    const int64_t most = frontier(r, top()) - (finished_at(r) ? 0 : 1);
    for (int64_t l = 0; l < levels; ++l) {
      const int64_t value = cached[r * levels + l];
      if (value < 0 || value > most)
        throw error("row ", r, ", level ", l, ": cached ", value, " outside [0, ", most, "] (",
                    finished_at(r) ? "finished: its committed length"
                                   : "held: its committed length - 1",
                    ")");
    }
  }

  // Copies first, then moves that cannot throw: a failed allocation leaves the ledger as it was.
  Ints frontiers(num_rows_ * levels);  // every token is committed: one value per row
  for (int64_t r = 0; r < num_rows_; ++r)
    std::fill_n(frontiers.begin() + r * levels, levels, frontier(r, top()));
  Ints sizes = block_sizes, lens = cached;
  num_levels_ = levels;
  block_sizes_ = std::move(sizes);
  frontier_ = std::move(frontiers);
  cached_ = std::move(lens);
  closed_.assign(num_rows_, 0);
  held_.assign(num_rows_, 0);
}

// ---------------------------------------------------------------------------------------- checks
void Ledger::check_row(int64_t row) const {
  if (row < 0 || row >= num_rows_)
    throw error("row ", row, " outside [0, ", num_rows_ - 1, "]");
}

void Ledger::check_level(int64_t level) const {
  if (level < 0 || level >= num_levels_)
    throw error("level ", level, " outside [0, ", num_levels_ - 1, "]");
}

void Ledger::check_distinct(const Ints& rows) const {
  // Duplicates first, as the model does (even among out-of-range rows): a mask for the rows in
  // range, a sorted copy of the others (only ever non-empty on the way to an error).
  std::vector<char> seen(num_rows_, 0);
  Ints outside;
  for (const int64_t r : rows) {
    if (r < 0 || r >= num_rows_) {
      outside.push_back(r);
    } else if (seen[r]) {
      throw error("rows contain duplicates: row ", r, " appears more than once");
    } else {
      seen[r] = 1;
    }
  }
  std::sort(outside.begin(), outside.end());
  const auto twice = std::adjacent_find(outside.begin(), outside.end());
  if (twice != outside.end())
    throw error("rows contain duplicates: row ", *twice, " appears more than once");
}

void Ledger::check_rows(int64_t level, const Ints& rows) const {
  check_level(level);
  check_distinct(rows);
  for (const int64_t r : rows) {
    check_row(r);
    const int64_t wanted = wanted_at(r);
    if (wanted == level) continue;
    if (wanted < 0)
      throw error("row ", r, finished_at(r) ? " is finished" : " is held",
                  ": it wants no level, not level ", level);
    throw error("row ", r, " wants level ", wanted, ", not level ", level);
  }
}

}  // namespace hsd
