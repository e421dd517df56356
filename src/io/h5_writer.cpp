#include "gpt2p/io/h5_writer.h"

#include <H5Cpp.h>

#include <exception>
#include <filesystem>
#include <map>

#include "gpt2p/core/error.h"

namespace gpt2p::io {
namespace {

constexpr hsize_t kChunkRows = 256;

H5::DataSet make_column(H5::Group& group, const std::string& name) {
  const hsize_t dims[1] = {0};
  const hsize_t maxdims[1] = {H5S_UNLIMITED};
  H5::DataSpace space(1, dims, maxdims);
  H5::DSetCreatPropList props;
  const hsize_t chunk[1] = {kChunkRows};
  props.setChunk(1, chunk);
  return group.createDataSet(name, H5::PredType::NATIVE_DOUBLE, space, props);
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
};

H5Writer::H5Writer(std::string path) : path_(std::move(path)), impl_(std::make_unique<Impl>()) {
  const auto parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  const std::string partial = path_ + ".partial";
  try {
    H5::Exception::dontPrint();
    impl_->file = H5::H5File(partial, H5F_ACC_TRUNC);
  } catch (const H5::Exception& e) {
    GPT2P_FAIL("cannot create timing file " << partial << ": " << e.getDetailMsg(),
               "check that --out points to a writable directory");
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
  impl_->file.createAttribute(name, type, scalar).write(type, value.empty() ? std::string(" ") : value);
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

void H5Writer::add_table(const std::string& table, const std::vector<std::string>& columns) {
  GPT2P_CHECK(impl_->tables.count(table) == 0, "table '" << table << "' declared twice in " << path_,
              "declare each table once");
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
