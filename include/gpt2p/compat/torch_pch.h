// The precompiled header shared by every library that uses torch (see CMakeLists.txt).
#pragma once
#include <torch/torch.h>
