// Reading back what our programs wrote, for assertions on the HDF5 timing files.
#pragma once

#include <H5Cpp.h>

#include <string>
#include <vector>

namespace gpt2p::testing {

// One column ("steps/loss") of a rank file, as doubles.
inline std::vector<double> read_column(const std::string& path, const std::string& name) {
  H5::H5File f(path, H5F_ACC_RDONLY);
  H5::DataSet ds = f.openDataSet(name);
  hsize_t n = 0;
  ds.getSpace().getSimpleExtentDims(&n);
  std::vector<double> v(n);
  if (n > 0) ds.read(v.data(), H5::PredType::NATIVE_DOUBLE);
  return v;
}

// A numeric attribute of the file's root group (rank files: "stage", "layer_begin", ...).
inline double read_attribute(const std::string& path, const std::string& name) {
  H5::H5File f(path, H5F_ACC_RDONLY);
  double v = 0;
  f.openAttribute(name).read(H5::PredType::NATIVE_DOUBLE, &v);
  return v;
}

}  // namespace gpt2p::testing
