// Per-rank timing files (HDF5): tables of float64 columns that grow a row at a time and are flushed
// after every row, so a crash keeps everything measured until then.
//
// Layout of <out>/rank<r>.h5 (written as rank<r>.h5.partial, renamed on close()):
//   /                 attributes: config (JSON), world_size, rank, host, gpu_name, git_commit,
//                     versions (JSON), program, plus any set_attribute() calls
//   /<table>/<column> one 1-D float64 dataset per column, all of equal length
// The tables the programs write (steps, epochs, actions) and their columns are documented in
// include/gpt2p/io/run_record.h; analysis/ reads them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gpt2p::io {

// kCreate: a new, empty file replaces any earlier one. kAppend: an existing `<path>` (or, when
// there is none, the `<path>.partial` a crash left) is continued: its attributes and rows are kept,
// it is renamed to `<path>.partial` while written, and add_table() reopens its tables, whose
// columns must be among the declared ones (a declared column the table lacks, one a later version
// added, is created with NaN in the rows already there; a crash in the middle of a row drops that
// incomplete row).
// Without an existing file kAppend creates one, as kCreate does.
enum class RecordMode { kCreate, kAppend };

class H5Writer {
 public:
  // Creates `<path>.partial` (parent directories too), or continues the file as `mode` says.
  explicit H5Writer(std::string path, RecordMode mode = RecordMode::kCreate);
  ~H5Writer();
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;

  void set_attribute(const std::string& name, const std::string& value);
  void set_attribute(const std::string& name, double value);
  void set_attribute(const std::string& name, long long value);
  // A root attribute of the file as text (strings as they are, numbers in decimal); nullopt when
  // the file has none of that name.
  std::optional<std::string> attribute(const std::string& name) const;
  // True when RecordMode::kAppend continued an existing file.
  bool continued() const;
  // For a caller that declines a continued file before writing to it: closes it and moves it back
  // to the name it was found under. Nothing is written afterwards.
  void put_back();

  // Declares a table; must come before append() to it. Columns are fixed once declared.
  void add_table(const std::string& table, const std::vector<std::string>& columns);
  // Appends one row (values in declared column order) and, unless told not to, flushes the file.
  void append(const std::string& table, const std::vector<double>& row, bool flush = true);
  long long rows(const std::string& table) const;

  // Flushes and renames `<path>.partial` to `<path>`. Also done by the destructor when no exception
  // is in flight; after a crash the .partial file keeps every flushed row.
  void close();

  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::string path_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpt2p::io
