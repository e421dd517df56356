#include "gpt2p/io/h5_writer.h"

#include <H5Cpp.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>

#include "gpt2p/core/error.h"

namespace gpt2p::io {
namespace {

constexpr hsize_t kChunkRows = 256;

// A column of `rows` rows, NaN until written.
H5::DataSet make_column(H5::Group& group, const std::string& name, hsize_t rows = 0) {
  const hsize_t dims[1] = {rows};
  const hsize_t maxdims[1] = {H5S_UNLIMITED};
  H5::DataSpace space(1, dims, maxdims);
  H5::DSetCreatPropList props;
  const hsize_t chunk[1] = {kChunkRows};
  props.setChunk(1, chunk);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  props.setFillValue(H5::PredType::NATIVE_DOUBLE, &nan);
  return group.createDataSet(name, H5::PredType::NATIVE_DOUBLE, space, props);
}

// Names of the datasets directly in `group`.
std::vector<std::string> member_names(const H5::Group& group) {
  std::vector<std::string> names;
  for (hsize_t i = 0; i < group.getNumObjs(); ++i) names.push_back(group.getObjnameByIdx(i));
  return names;
}

std::string joined(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

struct H5Writer::Impl {
  H5::H5File file;
  struct Table {
    H5::Group group;
    std::vector<H5::DataSet> columns;
    hsize_t rows = 0;
  };
  std::map<std::string, Table> tables;
  bool open = true;
  bool continued = false;
  std::string found_at;  // where a continued file was found

  void create(const std::string& partial);
  void reopen(const std::string& existing, const std::string& partial);
  Table open_table(const std::string& path, const std::string& table,
                   const std::vector<std::string>& columns);
};

void H5Writer::Impl::create(const std::string& partial) {
  try {
    file = H5::H5File(partial, H5F_ACC_TRUNC);
  } catch (const H5::Exception& e) {
    GPT2P_FAIL("cannot create timing file " << partial << ": " << e.getDetailMsg(),
               "check that --out points to a writable directory");
  }
}

// Opens `existing` for writing and moves it to `partial` (an open file keeps its handle).
void H5Writer::Impl::reopen(const std::string& existing, const std::string& partial) {
  const char* hint =
      "move the file out of --out to keep its rows elsewhere, then run again (a fresh file is "
      "started)";
  try {
    file = H5::H5File(existing, H5F_ACC_RDWR);
  } catch (const H5::Exception& e) {
    GPT2P_FAIL("cannot continue timing file " << existing << ": " << e.getDetailMsg(), hint);
  }
  std::error_code ec;
  if (existing != partial) std::filesystem::rename(existing, partial, ec);
  found_at = existing;
  GPT2P_CHECK(!ec, "cannot rename " << existing << " to " << partial << ": " << ec.message(),
              "check the output directory");
  continued = true;
}

// An existing table: its columns must be among `columns` (a column this version added to the table
// is created, NaN in the rows already there); rows beyond the shortest column are dropped.
H5Writer::Impl::Table H5Writer::Impl::open_table(const std::string& path, const std::string& table,
                                                 const std::vector<std::string>& columns) {
  Table t{file.openGroup(table), {}, 0};
  const auto found = member_names(t.group);
  const bool known = std::all_of(found.begin(), found.end(), [&](const std::string& name) {
    return std::find(columns.begin(), columns.end(), name) != columns.end();
  });
  GPT2P_CHECK(known && !found.empty(),
              "timing file " << path << ": table '" << table << "' has columns " << joined(found)
                             << " but this program records " << joined(columns),
              "the file was written by another version: move it out of --out, then run again");
  hsize_t rows = 0;
  bool first = true;
  for (const auto& name : columns) {
    if (std::find(found.begin(), found.end(), name) == found.end()) continue;
    hsize_t n = 0;
    t.group.openDataSet(name).getSpace().getSimpleExtentDims(&n);
    rows = first ? n : std::min(rows, n);
    first = false;
  }
  for (const auto& name : columns) {
    const bool exists = std::find(found.begin(), found.end(), name) != found.end();
    t.columns.push_back(exists ? t.group.openDataSet(name) : make_column(t.group, name, rows));
  }
  for (auto& c : t.columns) c.extend(&rows);  // extend sets the size: this trims longer columns
  t.rows = rows;
  return t;
}

H5Writer::H5Writer(std::string path, RecordMode mode)
    : path_(std::move(path)), impl_(std::make_unique<Impl>()) {
  const auto parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  const std::string partial = path_ + ".partial";
  H5::Exception::dontPrint();
  namespace fs = std::filesystem;
  if (mode == RecordMode::kAppend && fs::is_regular_file(path_)) {
    impl_->reopen(path_, partial);
  } else if (mode == RecordMode::kAppend && fs::is_regular_file(partial)) {
    impl_->reopen(partial, partial);
  } else {
    impl_->create(partial);
  }
}

H5Writer::~H5Writer() {
  if (impl_ && impl_->open && std::uncaught_exceptions() == 0) {
    try {
      close();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; .partial remains
    }
  }
}

void H5Writer::set_attribute(const std::string& name, const std::string& value) {
  H5::StrType type(H5::PredType::C_S1, value.empty() ? 1 : value.size());
  H5::DataSpace scalar(H5S_SCALAR);
  if (impl_->file.attrExists(name)) impl_->file.removeAttr(name);
  impl_->file.createAttribute(name, type, scalar)
      .write(type, value.empty() ? std::string(" ") : value);
}

void H5Writer::set_attribute(const std::string& name, double value) {
  H5::DataSpace scalar(H5S_SCALAR);
  if (impl_->file.attrExists(name)) impl_->file.removeAttr(name);
  impl_->file.createAttribute(name, H5::PredType::NATIVE_DOUBLE, scalar)
      .write(H5::PredType::NATIVE_DOUBLE, &value);
}

void H5Writer::set_attribute(const std::string& name, long long value) {
  H5::DataSpace scalar(H5S_SCALAR);
  if (impl_->file.attrExists(name)) impl_->file.removeAttr(name);
  impl_->file.createAttribute(name, H5::PredType::NATIVE_LLONG, scalar)
      .write(H5::PredType::NATIVE_LLONG, &value);
}

std::optional<std::string> H5Writer::attribute(const std::string& name) const {
  if (!impl_->file.attrExists(name)) return std::nullopt;
  H5::Attribute a = impl_->file.openAttribute(name);
  if (a.getTypeClass() == H5T_STRING) {
    std::string value;
    a.read(a.getStrType(), value);
    return value;
  }
  if (a.getTypeClass() == H5T_INTEGER) {
    long long value = 0;
    a.read(H5::PredType::NATIVE_LLONG, &value);
    return std::to_string(value);
  }
  double value = 0;
  a.read(H5::PredType::NATIVE_DOUBLE, &value);
  return std::to_string(value);
}

bool H5Writer::continued() const { return impl_->continued; }

void H5Writer::put_back() {
  if (!impl_->open) return;
  impl_->tables.clear();
  impl_->file.close();
  impl_->open = false;
  std::error_code ec;
  if (impl_->continued) std::filesystem::rename(path_ + ".partial", impl_->found_at, ec);
}

void H5Writer::add_table(const std::string& table, const std::vector<std::string>& columns) {
  GPT2P_CHECK(impl_->tables.count(table) == 0,
              "table '" << table << "' declared twice in " << path_, "declare each table once");
  if (impl_->continued && impl_->file.nameExists(table)) {
    impl_->tables.emplace(table, impl_->open_table(path_, table, columns));
    return;
  }
  Impl::Table t{impl_->file.createGroup(table), {}, 0};
  for (const auto& c : columns) t.columns.push_back(make_column(t.group, c));
  impl_->tables.emplace(table, std::move(t));
}

void H5Writer::append(const std::string& table, const std::vector<double>& row, bool flush) {
  auto it = impl_->tables.find(table);
  GPT2P_CHECK(it != impl_->tables.end(), "table '" << table << "' was not declared in " << path_,
              "call add_table first");
  auto& t = it->second;
  GPT2P_CHECK(row.size() == t.columns.size(),
              "row of " << row.size() << " values for table '" << table << "' with "
                        << t.columns.size() << " columns",
              "pass one value per declared column");
  const hsize_t new_size[1] = {t.rows + 1};
  const hsize_t offset[1] = {t.rows};
  const hsize_t one[1] = {1};
  H5::DataSpace mem(1, one);
  for (size_t c = 0; c < row.size(); ++c) {
    t.columns[c].extend(new_size);
    H5::DataSpace space = t.columns[c].getSpace();
    space.selectHyperslab(H5S_SELECT_SET, one, offset);
    t.columns[c].write(&row[c], H5::PredType::NATIVE_DOUBLE, mem, space);
  }
  t.rows += 1;
  if (flush) impl_->file.flush(H5F_SCOPE_LOCAL);
}

long long H5Writer::rows(const std::string& table) const {
  auto it = impl_->tables.find(table);
  return it == impl_->tables.end() ? 0 : static_cast<long long>(it->second.rows);
}

void H5Writer::close() {
  if (!impl_->open) return;
  impl_->tables.clear();
  impl_->file.close();
  impl_->open = false;
  std::error_code ec;
  std::filesystem::rename(path_ + ".partial", path_, ec);
  GPT2P_CHECK(!ec, "cannot rename " << path_ << ".partial: " << ec.message(),
              "check the output directory");
}

}  // namespace gpt2p::io
