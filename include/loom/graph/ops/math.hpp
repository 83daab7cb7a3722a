// Builder functions of this family (filled in with its kernels).
#pragma once

#include "loom/graph/builder.hpp"
