#include "gpt2p/io/run_info.h"

#include <H5public.h>
#include <mpi.h>

#include <array>
#include <boost/version.hpp>

#include "gpt2p/build_info.h"

namespace gpt2p::io {

nlohmann::json library_versions() {
  std::array<char, MPI_MAX_LIBRARY_VERSION_STRING> mpi{};
  int len = 0;
  MPI_Get_library_version(mpi.data(), &len);
  std::string mpi_version(mpi.data(), static_cast<size_t>(len));
  if (auto nl = mpi_version.find_first_of(",\n"); nl != std::string::npos) mpi_version.resize(nl);
  unsigned maj = 0;
  unsigned min = 0;
  unsigned rel = 0;
  H5get_libversion(&maj, &min, &rel);
  return {{"git_commit", build_info::kGitCommit},
          {"version", build_info::kVersion},
          {"torch", build_info::kTorchVersion},
          {"mpi", mpi_version},
          {"hdf5", std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel)},
          {"boost", std::to_string(BOOST_VERSION / 100000) + "." +
                        std::to_string(BOOST_VERSION / 100 % 1000)},
          {"compiler", build_info::kCompiler},
          {"cuda_build", build_info::kWithCuda}};
}

}  // namespace gpt2p::io
