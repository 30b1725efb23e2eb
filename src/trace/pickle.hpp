// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// A reader for Python pickles that holds plain data only: None, bools, ints, floats, strings,
// bytes, lists, tuples, dicts and sets, as PyTorch memory snapshots are. A pickle is a program
// for a stack machine that may import and call anything; this reader runs only the opcodes that
// build builtin values and rejects every other one before it could have any effect, so an
// untrusted file can at worst be refused.
//
// The parsed value is stored compactly for speed: one 16-byte node per value in an array,
// container children as a contiguous range of node indices, and strings as views into the pickle
// bytes. `Value` is a small handle into that storage; values are immutable once parsed, and two
// references to one memoized object (pickle's memo) are handles to the same node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cistern::trace::pickle {

/// What a value is. `big_integer` is an int outside the 64-bit range; only its approximate
/// value (a double) is kept. Python 2 `str` (STRING, BINSTRING opcodes) reads as `string`;
/// `bytearray` reads as `bytes`.
enum class Kind : std::uint8_t {
  none,
  boolean,
  integer,
  big_integer,
  real,
  string,
  bytes,
  list,
  tuple,
  dict,
  set,
  frozenset,
};

/// The Python name of a kind: "NoneType", "bool", "int", "float", "str", "bytes", "list", ...
std::string_view kind_name(Kind kind) noexcept;

/// Bounds that keep hostile input from exhausting time or memory after parsing.
struct Limits {
  /// The deepest nesting of containers accepted (Python's own pickler stops near 1000, its
  /// default recursion limit). Also bounds how many MARKs may be open at once.
  std::size_t max_depth = 1000;
  /// Shared references let a small pickle describe a huge tree (the "billion laughs" attack).
  /// The tree, with every shared reference expanded, may hold at most this many values per
  /// byte of pickle (and at least a million), so that a consumer that walks it naively does
  /// work linear in the input. Real snapshots share stack frames heavily and reach about 1.5.
  std::uint64_t max_expansion = 64;
};

namespace detail {

/// One value. Scalars live in `payload`; strings and bytes are `count` bytes at offset
/// `payload` of the input (or of the arena, for text that needed unescaping); containers are
/// `count` children starting at `children[payload]`, a dict as key, value, key, value, ...
struct Node {
  Kind kind = Kind::none;
  bool in_arena = false;
  std::uint32_t count = 0;
  std::uint64_t payload = 0;
};

/// Everything a parsed pickle owns. Lives on the heap so that handles survive moving the
/// `Document` that owns it.
struct Storage {
  std::string name;   ///< labels error messages, usually the file's path
  std::string input;  ///< the pickle bytes; most strings are views into them
  std::string arena;  ///< strings that had to be decoded (protocol 0 text)
  std::vector<Node> nodes;
  std::vector<std::uint32_t> children;
  std::uint32_t root = 0;
};

inline constexpr std::uint32_t no_parent = ~std::uint32_t{0};

}  // namespace detail

/// A handle to one value of a parsed pickle; cheap to copy, valid while its `Document` lives.
/// Accessors that find the wrong kind throw `cistern::InvalidArgument` with a message that names
/// the file, what was expected and found, and where (the key or index and the enclosing
/// container), e.g. "trace.pickle: expected int for key 'size' in {'action': 'alloc', ...},
/// got str '12'".
class Value {
 public:
  class Iterator;
  class ItemIterator;
  template <class It>
  struct Range {
    It first, last;
    It begin() const { return first; }
    It end() const { return last; }
  };

  /// What the value is.
  Kind kind() const noexcept { return node().kind; }
  /// The Python type name ("int", "dict", ...).
  std::string_view type_name() const noexcept { return kind_name(kind()); }

  bool is_none() const noexcept { return kind() == Kind::none; }
  bool is_bool() const noexcept { return kind() == Kind::boolean; }
  /// An int that fits in 64 bits (bools are not ints here).
  bool is_int() const noexcept { return kind() == Kind::integer; }
  bool is_double() const noexcept { return kind() == Kind::real; }
  /// An int, a big int or a float: anything `as_double` accepts.
  bool is_number() const noexcept;
  bool is_string() const noexcept { return kind() == Kind::string; }
  bool is_bytes() const noexcept { return kind() == Kind::bytes; }
  bool is_list() const noexcept { return kind() == Kind::list; }
  bool is_tuple() const noexcept { return kind() == Kind::tuple; }
  bool is_dict() const noexcept { return kind() == Kind::dict; }
  /// A set or a frozenset.
  bool is_set() const noexcept { return kind() == Kind::set || kind() == Kind::frozenset; }
  /// A list, tuple, set or frozenset: anything `operator[]` and iteration accept.
  bool is_sequence() const noexcept;

  /// The bool. Throws unless `is_bool()`.
  bool as_bool() const;
  /// The int. Throws unless `is_int()`; an int outside 64 bits throws saying so.
  std::int64_t as_int() const;
  /// The number as a double: floats, ints and big ints. Throws for anything else.
  double as_double() const;
  /// The text, UTF-8 as pickled (not validated). Throws unless `is_string()`.
  std::string_view as_string() const;
  /// The raw bytes of a bytes or string value. Throws for anything else.
  std::string_view as_bytes() const;

  /// The number of elements of a sequence, or of key-value pairs of a dict. Throws otherwise.
  std::size_t size() const;
  /// Element `index` of a sequence. Throws if not a sequence or if `index >= size()`.
  Value operator[](std::size_t index) const;
  /// The value stored under the string key `wanted` of a dict, or nothing. Linear search, from the
  /// last pair back, so that a repeated key yields its last value as in Python. Throws if this
  /// is not a dict.
  std::optional<Value> find(std::string_view wanted) const;
  /// Like `find`, but throws naming the key when it is missing.
  Value at(std::string_view wanted) const;
  /// Key and value of pair `index` of a dict, in pickled order. Throws if out of range.
  Value key(std::size_t index) const;
  Value value(std::size_t index) const;

  /// Elements of a sequence, in order. Throws if this is not a sequence (use `items()` for
  /// dicts).
  Iterator begin() const;
  Iterator end() const;
  /// The (key, value) pairs of a dict, in pickled order. Throws if this is not a dict.
  Range<ItemIterator> items() const;

  /// A short Python-like rendering for messages, cut to about `max_chars` characters:
  /// `{'action': 'alloc', 'size': 512, ...}`.
  std::string describe(std::size_t max_chars = 80) const;
  /// True if both handles refer to the very same pickled object (memo sharing).
  bool same_object(const Value& other) const noexcept {
    return storage_ == other.storage_ && node_ == other.node_;
  }
  /// A number that names the pickled object this handle refers to, unique within its document:
  /// two handles have the same identity exactly when `same_object` holds. Readers use it to
  /// convert an object that the pickle shares (memo) only once.
  std::uint32_t identity() const noexcept { return node_; }

 private:
  friend class Document;
  Value(const detail::Storage* storage, std::uint32_t node, std::uint32_t parent,
        std::uint32_t slot) noexcept
      : storage_(storage), node_(node), parent_(parent), slot_(slot) {}

  const detail::Node& node() const noexcept { return storage_->nodes[node_]; }
  Value child(std::uint32_t slot) const noexcept;
  void require(Kind wanted) const;
  [[noreturn]] void fail_expected(std::string_view expected) const;
  std::string where() const;

  const detail::Storage* storage_;
  std::uint32_t node_;
  std::uint32_t parent_;  ///< the container this handle was reached through, for messages
  std::uint32_t slot_;    ///< its position among the parent's children
};

/// Iterates the elements of a sequence.
class Value::Iterator {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = Value;
  using difference_type = std::ptrdiff_t;
  using pointer = void;
  using reference = Value;

  Value operator*() const noexcept { return parent_.child(slot_); }
  Iterator& operator++() noexcept {
    ++slot_;
    return *this;
  }
  Iterator operator++(int) noexcept {
    Iterator before = *this;
    ++slot_;
    return before;
  }
  friend bool operator==(const Iterator& a, const Iterator& b) noexcept {
    return a.slot_ == b.slot_;
  }
  friend bool operator!=(const Iterator& a, const Iterator& b) noexcept {
    return a.slot_ != b.slot_;
  }

 private:
  friend class Value;
  Iterator(Value parent, std::uint32_t slot) noexcept : parent_(parent), slot_(slot) {}
  Value parent_;
  std::uint32_t slot_;
};

/// Iterates the (key, value) pairs of a dict.
class Value::ItemIterator {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = std::pair<Value, Value>;
  using difference_type = std::ptrdiff_t;
  using pointer = void;
  using reference = value_type;

  value_type operator*() const noexcept { return {parent_.child(slot_), parent_.child(slot_ + 1)}; }
  ItemIterator& operator++() noexcept {
    slot_ += 2;
    return *this;
  }
  ItemIterator operator++(int) noexcept {
    ItemIterator before = *this;
    slot_ += 2;
    return before;
  }
  friend bool operator==(const ItemIterator& a, const ItemIterator& b) noexcept {
    return a.slot_ == b.slot_;
  }
  friend bool operator!=(const ItemIterator& a, const ItemIterator& b) noexcept {
    return a.slot_ != b.slot_;
  }

 private:
  friend class Value;
  ItemIterator(Value parent, std::uint32_t slot) noexcept : parent_(parent), slot_(slot) {}
  Value parent_;
  std::uint32_t slot_;
};

/// A parsed pickle: owns the bytes and every value built from them. Move-only; moving keeps
/// every `Value` handle valid.
class Document {
 public:
  /// The value the pickle returns (the object on the stack at STOP).
  Value root() const& noexcept;
  /// Deleted: a handle into a temporary document would dangle (`parse(bytes).root()`).
  Value root() const&& = delete;
  /// The name given at parse time, used in messages.
  const std::string& name() const noexcept { return storage_->name; }
  /// How many values were built (including ones the pickle discarded).
  std::size_t node_count() const noexcept { return storage_->nodes.size(); }

 private:
  friend Document parse(std::string bytes, std::string name, const Limits& limits);
  explicit Document(std::unique_ptr<detail::Storage> storage) noexcept
      : storage_(std::move(storage)) {}
  std::unique_ptr<detail::Storage> storage_;
};

/// Parses the pickle `bytes` (protocols 0 to 5). `name` labels error messages.
/// Throws `cistern::InvalidArgument` with a message "<name>: offset N: <problem>" for any
/// opcode that would import or call (named, with its byte value), any unknown opcode, and any
/// malformation: truncation, stack underflow, a missing MARK, an undefined memo key, bad
/// arguments, or nesting deeper than `limits.max_depth`. Recursive structures (a list that
/// contains itself) are rejected too, since consumers could otherwise walk them forever.
Document parse(std::string bytes, std::string name, const Limits& limits = {});

/// Reads the file at `path` (gzipped or not, see `trace::read_file`) and parses it.
Document read_file(const std::string& path, const Limits& limits = {});

}  // namespace cistern::trace::pickle
