// Python bindings of the ledger: argument conversion and docstrings only. Validation lives in
// ledger.cpp (std::invalid_argument, which pybind11 raises as ValueError).
//
// Sequences arrive as anything numpy.asarray accepts (list, tuple, numpy array of any integer or bool
// dtype, contiguous or not) and leave as numpy int64 arrays. Not 1-D -> ValueError; not integer ->
// TypeError (an empty sequence of any dtype is fine), as the Python model converts them.
//
// No call crashes on a ledger whose C++ object was never constructed (`Ledger.__new__(Ledger)`, or
// `pybind11_object.__new__(Ledger)`, skip `__init__`): see the type caster below.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <string>

#include "ledger.hpp"
#include "lookup_index.hpp"

namespace py = pybind11;

// Every binding receives its `self` through these casters (member function pointers as `const T*`,
// lambdas as `const T&`). pybind11's own caster, given an instance whose C++ value was never
// constructed, allocates raw storage and hands it over as the object (pybind11 issue #6153): a
// segfault or worse on the first access. These refuse such an instance with a TypeError first.
// (`__init__` itself takes the instance as a value_and_holder, not through a caster, so constructing
// a bare instance still works.) Only this translation unit binds these classes, so the
// specialisations are seen by every use.
namespace pybind11::detail {
template <class T>
class constructed_caster : public type_caster_base<T> {
 public:
  bool load(handle src, bool convert) {
    const type_info* info = get_type_info(typeid(T));
    if (src && info != nullptr && PyObject_TypeCheck(src.ptr(), info->type)) {
      auto* inst = reinterpret_cast<instance*>(src.ptr());
      if (!inst->get_value_and_holder(info).holder_constructed())
        throw type_error(std::string("this ") + info->type->tp_name +
                         " was never initialised (created by __new__ without __init__); construct "
                         "one by calling the class");
    }
    return type_caster_base<T>::load(src, convert);
  }
};
template <>
class type_caster<hsd::Ledger> : public constructed_caster<hsd::Ledger> {};
template <>
class type_caster<hsd::LookupIndex> : public constructed_caster<hsd::LookupIndex> {};
template <>
class type_caster<hsd::LookupLevel> : public constructed_caster<hsd::LookupLevel> {};
}  // namespace pybind11::detail

using hsd::Ledger;
using hsd::LookupIndex;
using hsd::LookupLevel;
using Ints = Ledger::Ints;
using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

namespace {

py::array as_array(const py::object& obj, const std::string& name) {
  py::array arr = py::array::ensure(obj);  // null (error cleared) when numpy cannot convert it
  if (!arr) throw py::type_error(name + " must be a sequence of integers");
  return arr;
}

Ints integers(const py::array& arr, const std::string& name) {
  const char kind = arr.dtype().kind();
  if (arr.size() > 0 && kind != 'i' && kind != 'u' && kind != 'b')
    throw py::type_error(name + " must hold integers, got dtype " + std::string(py::str(arr.dtype())));
  const auto ints = Int64Array::ensure(arr);
  if (!ints) throw py::type_error(name + " must be a sequence of integers");
  return Ints(ints.data(), ints.data() + ints.size());
}

Ints to_ints(const py::object& obj, const std::string& name) {
  const py::array arr = as_array(obj, name);
  if (arr.ndim() != 1)
    throw py::value_error(name + " must be a 1-D sequence, got " + std::to_string(arr.ndim()) +
                          " dimensions");
  return integers(arr, name);
}

py::array_t<int64_t> to_numpy(const Ints& values) {
  py::array_t<int64_t> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

py::array_t<int64_t> to_numpy_2d(const Ints& values, int64_t rows, int64_t cols) {  // [rows, cols]
  py::array_t<int64_t> out({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)});
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

// pybind11 answers `__init__` on an instance already constructed by doing nothing (its dispatcher
// returns before any constructor runs), so `ledger.__init__(...)` would silently keep the old state.
// This wraps a class's `__init__` to refuse that with a TypeError; a first construction goes on to
// pybind11's own `__init__` (its overloads, argument names and errors).
template <class T>
void refuse_second_init(py::module_& m, const char* name) {
  py::object cls = m.attr(name);
  py::object init = cls.attr("__init__");
  const std::string doc = py::str(init.attr("__doc__"));
  auto checked = [init](py::handle self, const py::args& args, const py::kwargs& kwargs) {
    const py::detail::type_info* info = py::detail::get_type_info(typeid(T));
    if (info != nullptr && PyObject_TypeCheck(self.ptr(), info->type)) {
      auto* inst = reinterpret_cast<py::detail::instance*>(self.ptr());
      if (inst->get_value_and_holder(info).holder_constructed())
        throw py::type_error(std::string("this ") + info->type->tp_name +
                             " is already constructed: __init__ cannot rebuild it; construct a new "
                             "one by calling the class");
    }
    init(self, *args, **kwargs);
  };
  // Named otherwise: pybind11 takes any function named __init__ for a constructor and applies the
  // same do-nothing rule before calling it.
  cls.attr("__init__") =
      py::cpp_function(checked, py::name("checked_init"), py::is_method(cls), py::doc(doc.c_str()));
}

Ledger make_ledger(int64_t num_levels, const py::object& block_sizes, const py::object& prompt_lens,
                   const py::object& max_new_tokens, const std::string& policy) {
  Ints sizes = to_ints(block_sizes, "block_sizes");
  Ints prompts = to_ints(prompt_lens, "prompt_lens");
  const py::array budget = as_array(max_new_tokens, "max_new_tokens");
  if (budget.ndim() == 0)  // one int: the same budget for every row
    return Ledger(num_levels, sizes, prompts, integers(budget, "max_new_tokens")[0], policy);
  return Ledger(num_levels, sizes, prompts, to_ints(budget, "max_new_tokens"), policy);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() =
      "C++ core of hsd_fast: the nested KV-cache ledger of Hierarchical Speculative Decoding "
      "(integers only; specified by tests/ledger_model.py) and the lookup level's n-gram index.";

  py::class_<Ledger>(m, "Ledger", R"doc(
Per row and level: tags (as frontiers), pending counts, valid KV-cache lengths, EOS and length budget.

Levels are 0..K (K = num_levels - 1, the target). ``frontier[row, l]`` = number of tokens (prompt
included) whose tag is >= l, so ``frontier[:, 0]`` is the sequence length and ``frontier[:, K]`` the
committed length. ``cached[row, l]`` = leading positions level l's KV cache holds validly.

Loop: ``level = next_level()``; ``rows = rows_for(level)``; ``spans(level, rows)`` says what to feed;
then ``commit_draft`` or ``commit_proposal`` (level 0) or ``commit_verify`` (level >= 1). To switch
hierarchies between rounds: ``hold`` rows at their round boundaries, then ``reconfigure``. Invalid
arguments raise ValueError before any state changes.
)doc")
      .def(py::init(&make_ledger), py::arg("num_levels"), py::arg("block_sizes"),
           py::arg("prompt_lens"), py::arg("max_new_tokens"), py::arg("policy") = "most_rows",
           R"doc(
num_levels: K + 1 (at least 1: the target alone decodes autoregressively).
block_sizes: T_0..T_{K-1}, each >= 1: level i+1 verifies once T_i tokens tagged i wait.
prompt_lens: one length >= 1 per row. max_new_tokens: one int >= 0, or one per row.
policy: which level runs when rows want different ones: "most_rows" (ties to the higher level) or
"highest_level".
)doc")
      .def_property_readonly("num_levels", &Ledger::num_levels)
      .def_property_readonly("num_rows", &Ledger::num_rows)
      .def_property_readonly(
          "block_sizes",
          [](const Ledger& self) {
            py::list out;
            for (const int64_t t : self.block_sizes()) out.append(t);
            return out;
          },
          "T_0..T_{K-1} (a new list).")
      .def_property_readonly("policy", &Ledger::policy)

      .def("seq_len", &Ledger::seq_len, py::arg("row"), "Tokens in the row, speculative included.")
      .def("committed_len", &Ledger::committed_len, py::arg("row"),
           "Tokens tagged K (the prompt included).")
      .def("pending", &Ledger::pending, py::arg("row"), py::arg("level"),
           "Tokens tagged exactly `level` (0 for the top level: its tokens are committed).")
      .def("last_tag", &Ledger::last_tag, py::arg("row"), "Tag of the row's last token.")
      .def(
          "tags", [](const Ledger& self, int64_t row) { return to_numpy(self.tags(row)); },
          py::arg("row"), "int64 [seq_len]: the tag of every position (non-increasing).")
      .def("finished", &Ledger::finished, py::arg("row"),
           "Whether an EOS is committed or the length budget is committed in full.")
      .def("output_len", &Ledger::output_len, py::arg("row"),
           "Committed length, cut after a committed EOS.")
      .def("wanted_level", &Ledger::wanted_level, py::arg("row"),
           "The level the row needs next; -1 once it is finished, and while it is held.")
      .def("held", &Ledger::held, py::arg("row"), "Whether hold() holds the row (until reconfigure).")

      .def(
          "frontiers",
          [](const Ledger& self) {
            return to_numpy_2d(self.frontiers(), self.num_rows(), self.num_levels());
          },
          "int64 [num_rows, num_levels]: tokens whose tag is >= level (a copy).")
      .def(
          "cached_lens",
          [](const Ledger& self) {
            return to_numpy_2d(self.cached_lens(), self.num_rows(), self.num_levels());
          },
          "int64 [num_rows, num_levels]: valid KV-cache length per level (a copy).")
      .def(
          "seq_lens", [](const Ledger& self) { return to_numpy(self.seq_lens()); },
          "int64 [num_rows].")
      .def(
          "output_lens", [](const Ledger& self) { return to_numpy(self.output_lens()); },
          "int64 [num_rows]: committed lengths, cut after a committed EOS.")
      .def(
          "eos_positions", [](const Ledger& self) { return to_numpy(self.eos_positions()); },
          "int64 [num_rows]: position of the drawn EOS, -1 where the row holds none.")
      .def(
          "holds", [](const Ledger& self) { return to_numpy(self.holds()); },
          "int64 [num_rows]: 1 where the row is held, else 0.")
      .def("all_finished", &Ledger::all_finished)
      .def(
          "wanted_levels", [](const Ledger& self) { return to_numpy(self.wanted_levels()); },
          "int64 [num_rows]: wanted_level of every row.")
      .def("next_level", &Ledger::next_level,
           "The level to run next under the policy; -1 when every row is finished or held.")
      .def(
          "rows_for",
          [](const Ledger& self, int64_t level) { return to_numpy(self.rows_for(level)); },
          py::arg("level"), "int64: the rows that want `level`, ascending.")

      .def(
          "spans",
          [](const Ledger& self, int64_t level, const py::object& rows) {
            const Ledger::Spans s = self.spans(level, to_ints(rows, "rows"));
            return py::make_tuple(to_numpy(s.feed_start), to_numpy(s.feed_end),
                                  to_numpy(s.out_start));
          },
          py::arg("level"), py::arg("rows"), R"doc(
Per row (int64 arrays): feed_start, feed_end (level feeds positions [feed_start, feed_end): all it
has not cached) and out_start (first position whose logits are needed; logits at position t give the
distribution of token t + 1). Every row must want `level`.
)doc")
      .def(
          "commit_draft",
          [](Ledger& self, const py::object& rows, const py::object& is_eos) {
            self.commit_draft(to_ints(rows, "rows"), to_ints(is_eos, "is_eos"));
          },
          py::arg("rows"), py::arg("is_eos"),
          "Level 0 fed its span and drew one token (tag 0) per row at position seq_len.")
      .def(
          "commit_proposal",
          [](Ledger& self, const py::object& rows, const py::object& counts,
             const py::object& last_is_eos) {
            self.commit_proposal(to_ints(rows, "rows"), to_ints(counts, "counts"),
                                 to_ints(last_is_eos, "last_is_eos"));
          },
          py::arg("rows"), py::arg("counts"), py::arg("last_is_eos"), R"doc(
Level 0 proposed counts[i] tokens at once (0 up to the room left in its block of T_0 and in the
length budget), the last an EOS where last_is_eos[i], and closed its block: the row wants level 1
next, which verifies whatever is pending, even nothing. Equivalent to counts[i] commit_draft calls
followed by the close.
)doc")
      .def(
          "commit_verify",
          [](Ledger& self, int64_t level, const py::object& rows, const py::object& num_accepted,
             const py::object& extra_is_eos) {
            const Ledger::Verified v =
                self.commit_verify(level, to_ints(rows, "rows"), to_ints(num_accepted, "num_accepted"),
                                   to_ints(extra_is_eos, "extra_is_eos"));
            return py::make_tuple(to_numpy(v.kept_extra), to_numpy(v.cascaded));
          },
          py::arg("level"), py::arg("rows"), py::arg("num_accepted"), py::arg("extra_is_eos"),
          R"doc(
Level (>= 1) fed its span and verified its block [frontier[level], seq_len) of tag level - 1:
num_accepted[i] drafts passed, then a correction (on a rejection) or a bonus token follows, EOS or not
as extra_is_eos[i] says. A bonus is dropped when the last accepted draft is EOS or the length budget is
full. A rejection at position j cuts every level's cache to at most j.
Returns int64 arrays (kept_extra: 0/1, cascaded: how many levels below `level` lost cache entries).
)doc")
      .def(
          "hold",
          [](Ledger& self, const py::object& rows) { self.hold(to_ints(rows, "rows")); },
          py::arg("rows"), R"doc(
The rows wait at their round boundary: each holds no speculative token (seq_len == committed_len) and
no closed block, or is finished. A held row wants no level (-1) until the next reconfigure; holding it
again is allowed. finished() and all_finished() are unchanged.
)doc")
      .def(
          "reconfigure",
          [](Ledger& self, const py::object& block_sizes, const py::object& cached) {
            self.reconfigure(to_ints(block_sizes, "block_sizes"), to_ints(cached, "cached"));
          },
          py::arg("block_sizes"), py::arg("cached"), R"doc(
Every row finished or held: the ledger gets len(block_sizes) + 1 levels (block sizes >= 1; none: the
target alone). cached: int64 [num_rows * num_levels], row-major (the new num_levels): what each new
level's cache validly holds of the row's committed prefix, in [0, committed_len - 1] for a held row
(each level feeds at least its last token) and [0, committed_len] for a finished one. Every frontier
becomes the committed length, every hold is released; EOS positions and length budgets are kept.
)doc");

  py::class_<LookupIndex>(m, "LookupIndex", R"doc(
One row's prompt-lookup index (csrc/lookup_index.hpp): follows the row's tokens through extend and
truncate and proposes what followed the most recent earlier occurrence of the longest matching suffix
(n from max_ngram down to min_ngram), read on into the proposal where the sequence ends first.
)doc")
      .def(py::init<int64_t, int64_t>(), py::arg("max_ngram") = 3, py::arg("min_ngram") = 1)
      .def_property_readonly("max_ngram", &LookupIndex::max_ngram)
      .def_property_readonly("min_ngram", &LookupIndex::min_ngram)
      .def("__len__", &LookupIndex::size)
      .def_property_readonly(
          "tokens", [](const LookupIndex& self) { return to_numpy(self.tokens()); },
          "int64 [len]: the row's sequence as indexed (a copy).")
      .def(
          "extend",
          [](LookupIndex& self, const py::object& tokens) {
            const Ints values = to_ints(tokens, "tokens");
            self.extend(values.data(), static_cast<int64_t>(values.size()));
          },
          py::arg("tokens"), "Append tokens and index every n-gram they end.")
      .def("truncate", &LookupIndex::truncate, py::arg("length"),
           "Keep only the first `length` tokens (0 <= length <= len), unindexing the rest.")
      .def(
          "propose",
          [](const LookupIndex& self, int64_t k) {
            Ints out(static_cast<size_t>(std::max<int64_t>(k, 0)));
            out.resize(static_cast<size_t>(self.propose(k, out.data())));
            return to_numpy(out);
          },
          py::arg("k"), "int64: at most k (>= 0) proposed tokens; empty when no suffix matches.");

  m.attr("MAX_NGRAM") = hsd::kMaxNgram;

  py::class_<LookupLevel>(m, "LookupLevel", R"doc(
The lookup level of one run: a LookupIndex per row and, per row, how many leading tokens it holds
unchanged (``valid``). Each round: ``window_start(rows)``, then ``propose`` with the rows' tokens from
there to their ends; after a verification, ``invalidate`` from the first position it replaced.
)doc")
      .def(py::init([](int64_t num_rows, int64_t max_ngram, int64_t min_ngram, const py::object& eos_ids) {
             return std::make_unique<LookupLevel>(num_rows, max_ngram, min_ngram, to_ints(eos_ids, "eos_ids"));
           }),
           py::arg("num_rows"), py::arg("max_ngram"), py::arg("min_ngram"), py::arg("eos_ids"))
      .def_property_readonly("num_rows", &LookupLevel::num_rows)
      .def(
          "row", [](const LookupLevel& self, int64_t r) { return to_numpy(self.row(r).tokens()); },
          py::arg("row"), "int64: the tokens row `row`'s index holds (a copy; at least its valid ones).")
      .def(
          "valid", [](const LookupLevel& self) { return to_numpy(self.valid()); },
          "int64 [num_rows]: leading tokens each row's index holds unchanged (a copy).")
      .def(
          "invalidate",
          [](LookupLevel& self, const py::object& rows, const py::object& first_changed) {
            self.invalidate(to_ints(rows, "rows"), to_ints(first_changed, "first_changed"));
          },
          py::arg("rows"), py::arg("first_changed"),
          "A verification of `rows` may have replaced their tokens from first_changed[i] on.")
      .def(
          "window_start",
          [](const LookupLevel& self, const py::object& rows) { return self.window_start(to_ints(rows, "rows")); },
          py::arg("rows"), "The first position propose() reads for `rows` (the smallest valid; 0 for none).")
      .def(
          "propose",
          [](LookupLevel& self, const py::object& rows, const py::object& window, const py::object& ends,
             const py::object& wanted) {
            const Ints row_ids = to_ints(rows, "rows");
            const py::array arr = as_array(window, "window");
            if (arr.ndim() != 2 || arr.shape(0) != static_cast<py::ssize_t>(row_ids.size()))
              throw py::value_error("window must be [len(rows), width]");
            const Ints tokens = integers(arr, "window");  // row-major [R, width]
            const LookupLevel::Proposals p =
                self.propose(row_ids, tokens.data(), static_cast<int64_t>(arr.shape(1)),
                             to_ints(ends, "ends"), to_ints(wanted, "wanted"));
            py::array_t<bool> last_is_eos(static_cast<py::ssize_t>(p.last_is_eos.size()));
            std::copy(p.last_is_eos.begin(), p.last_is_eos.end(), last_is_eos.mutable_data());
            return py::make_tuple(to_numpy_2d(p.tokens, static_cast<int64_t>(row_ids.size()), p.width),
                                  to_numpy(p.counts), last_is_eos);
          },
          py::arg("rows"), py::arg("window"), py::arg("ends"), py::arg("wanted"), R"doc(
Brings each row's index up to ends[i] tokens, reading them from window (int64 [R, width]: the tokens
at positions window_start(rows) onwards of rows[i]), and proposes at most wanted[i] tokens, cut after
an EOS. Returns (tokens int64 [R, max(wanted)]: row i's first counts[i] entries proposed, zeros after;
counts int64 [R]; last_is_eos bool [R]). Rows must be distinct.
)doc");

  refuse_second_init<Ledger>(m, "Ledger");
  refuse_second_init<LookupIndex>(m, "LookupIndex");
  refuse_second_init<LookupLevel>(m, "LookupLevel");
}
